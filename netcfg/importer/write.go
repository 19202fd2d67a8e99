package importer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ConfigName is the config's file name in the output directory.
const ConfigName = "nodeagent.yaml"

// WriteOut writes r under dir as it is to be installed under Options.Root:
// dir/nodeagent.yaml (0644), the notes file (0600) and each of r.Files at
// its path with its mode, in directories of mode 0700.
//
// Every directory on the way to dir must be safe from other users, or the
// keys could be swapped before the operator installs them: each is owned
// by root or by this user and writable by nobody else (a sticky directory
// such as /tmp excepted: there no one else can rename or remove what this
// user makes), and a symbolic link on the way too is root's or this
// user's. dir itself is new, or an empty directory of this user's.
//
// Everything is written into a new directory beside dir and renamed into
// place at the end, so a failure leaves nothing half-written (the
// directory is removed) and nothing is ever overwritten.
func WriteOut(dir string, r Result) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	parent, err := safeParent(abs)
	if err != nil {
		return err
	}
	final := filepath.Join(parent, filepath.Base(abs))
	switch st, err := os.Lstat(final); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case !st.IsDir():
		return fmt.Errorf("%s is not a directory (a link is not followed)", dir)
	default:
		if uid := st.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
			return fmt.Errorf("%s belongs to uid %d, not to this user: give a new directory, or one of your own", dir, uid)
		}
		if entries, err := os.ReadDir(final); err != nil {
			return err
		} else if len(entries) > 0 {
			return fmt.Errorf("%s is not empty; give a new or empty directory", dir)
		}
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(abs)+".tmp-")
	if err != nil {
		return err
	}
	if err := fill(tmp, r); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	// A directory renamed onto an empty one replaces it (rename(2); Go's
	// os.Rename refuses an existing directory).
	if err := unix.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("%s: %w", dir, err)
	}
	return nil
}

// fill writes r into the new directory dir.
func fill(dir string, r Result) error {
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if err := create(filepath.Join(dir, ConfigName), r.Config, 0o644); err != nil {
		return err
	}
	if r.Private != "" {
		if err := create(filepath.Join(dir, NotesName), []byte(r.Private), 0o600); err != nil {
			return err
		}
	}
	for _, f := range r.Files {
		rel := filepath.Clean(filepath.FromSlash(f.Path))
		if filepath.IsAbs(rel) || rel == "." || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("file path %q is not inside the output directory", f.Path)
		}
		if err := mkdirs(dir, filepath.Dir(rel)); err != nil {
			return err
		}
		if err := create(filepath.Join(dir, rel), f.Data, f.Mode); err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
	}
	// The directory is on disk before it is renamed into place.
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// safeParent checks every directory on the way to abs (an absolute path)
// and returns its parent with links resolved; the parent must exist.
func safeParent(abs string) (string, error) {
	euid := os.Geteuid()
	mine := func(st *syscall.Stat_t) bool { return st.Uid == 0 || int(st.Uid) == euid }
	// The links on the path as given: the steps print it, so whoever owns
	// a link could point it elsewhere before the files are installed.
	cur := "/"
	for _, part := range strings.Split(strings.TrimPrefix(filepath.Dir(abs), "/"), "/") {
		if part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		var st unix.Stat_t
		if err := unix.Lstat(cur, &st); err != nil {
			return "", fmt.Errorf("--out: %s: %w", cur, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK && st.Uid != 0 && int(st.Uid) != euid {
			return "", fmt.Errorf("--out: %s is a link of uid %d: write under directories of root's or yours", cur, st.Uid)
		}
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", fmt.Errorf("--out: %w", err)
	}
	cur = "/"
	parts := append([]string{""}, strings.Split(strings.TrimPrefix(parent, "/"), "/")...)
	for _, part := range parts {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if err != nil {
			return "", fmt.Errorf("--out: %s: %w", cur, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		switch {
		case !fi.IsDir():
			return "", fmt.Errorf("--out: %s is not a directory", cur)
		case !mine(st):
			return "", fmt.Errorf("--out: %s belongs to uid %d, who could swap what is written there before it is installed: write under directories of root's or yours", cur, st.Uid)
		case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0:
			return "", fmt.Errorf("--out: %s is writable by others (mode %04o), who could swap what is written there before it is installed: write under directories only root or you can write", cur, fi.Mode().Perm())
		}
	}
	return parent, nil
}

// mkdirs makes each directory of rel under dir with mode 0700.
func mkdirs(dir, rel string) error {
	if rel == "." {
		return nil
	}
	cur := dir
	for part := range strings.SplitSeq(rel, string(filepath.Separator)) {
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(cur, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if st, err := os.Lstat(cur); err != nil || !st.IsDir() {
			return fmt.Errorf("%s is not a directory", cur)
		}
	}
	return nil
}

// create writes a new file with exactly mode (the umask does not apply).
func create(path string, data []byte, mode fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscallNoFollow, mode)
	if err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syscallNoFollow refuses a link in the last component.
const syscallNoFollow = unix.O_NOFOLLOW
