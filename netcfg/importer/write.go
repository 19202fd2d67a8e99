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
// dir/nodeagent.yaml (0644) and each of r.Files at its path with its mode,
// in directories of mode 0700. dir must not exist or be empty: nothing is
// ever overwritten (files are created with O_EXCL, never through a link).
func WriteOut(dir string, r Result) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s is not empty; give a new or empty directory", dir)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// An empty directory someone else made (in /tmp, say) is not ours to
	// fill with keys: its owner could swap the files before they are
	// installed. Nor is a link to a directory.
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory (a link is not followed)", dir)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%s belongs to uid %d, not to this user: give a new directory, or one of your own", dir, sys.Uid)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if err := create(filepath.Join(dir, ConfigName), r.Config, 0o644); err != nil {
		return err
	}
	if r.Private != "" {
		if err := create(filepath.Join(dir, notesName), []byte(r.Private), 0o600); err != nil {
			return err
		}
	}
	for _, f := range r.Files {
		rel := filepath.Clean(filepath.FromSlash(f.Path))
		if filepath.IsAbs(rel) || rel == "." || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("file path %q is not inside the output directory", f.Path)
		}
		p := filepath.Join(dir, rel)
		if err := mkdirs(dir, filepath.Dir(rel)); err != nil {
			return err
		}
		if err := create(p, f.Data, f.Mode); err != nil {
			return err
		}
	}
	return nil
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
