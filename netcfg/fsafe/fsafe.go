// Package fsafe reads files that may come from a directory others can write
// (the WireGuard peer register, key files, credentials) and writes files
// atomically.
//
// A read opens the file without blocking (O_NONBLOCK: a FIFO swapped in for
// a key file cannot wedge the caller), checks the open descriptor, not the
// name (fstat: a regular file, not writable by others, optionally private to
// its owner and owned by root; fstatfs: not on procfs, sysfs, debugfs,
// tracefs, securityfs, configfs, bpffs or FUSE, where a "file" is the kernel
// or another process talking), and reads at most a size cap. Links are not
// followed unless the caller says so; a register directory's files may be
// links that stay inside it (openat2 RESOLVE_BENEATH).
//
// Errors name the file and the reason and never quote what the file holds.
package fsafe

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Rules say what a file must be to be read.
type Rules struct {
	// MaxSize is the most bytes read; a bigger file is refused. It must be
	// positive.
	MaxSize int64
	// FollowLinks follows a symbolic link in the last component of the
	// path. Off, a link is refused.
	FollowLinks bool
	// Private refuses a file with any permission bit for group or others:
	// key material that others can read is no longer secret.
	Private bool
	// RootOwned refuses a file not owned by root (or by the user this
	// process runs as): whoever owns a key file can replace the key.
	RootOwned bool
}

// Error is a file refused or unreadable. Its text is "PATH REASON", the
// reason a verb phrase ("is a FIFO, not a regular file"), and never holds
// the file's contents.
type Error struct {
	Path   string
	Reason string
	// Err is the system error behind Reason, if any (errors.Is finds
	// fs.ErrNotExist, fs.ErrPermission).
	Err error
}

func (e *Error) Error() string { return e.Path + " " + e.Reason }
func (e *Error) Unwrap() error { return e.Err }

func refuse(path, format string, args ...any) error {
	return &Error{Path: path, Reason: fmt.Sprintf(format, args...)}
}

// Open flags for every read: never block on a FIFO or a device, never make
// a terminal ours, never leak the descriptor into a child.
const openFlags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC

// ReadFile reads the file at path under r.
func ReadFile(path string, r Rules) ([]byte, error) {
	flags := openFlags
	if !r.FollowLinks {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := retryEINTR(func() (int, error) { return unix.Open(path, flags, 0) })
	if err != nil {
		return nil, openError(path, err, "")
	}
	defer unix.Close(fd)
	return readFD(path, fd, r)
}

// Dir is a directory whose files are read relative to it, so that a link in
// it cannot lead out of it.
type Dir struct {
	path  string
	clean string // path, cleaned
	f     *os.File
	fd    int
	// fsErr is the directory's own filesystem check (fstatfs): files are
	// opened without crossing a mount (RESOLVE_NO_XDEV), so they are on
	// the same filesystem, checked once here rather than per file.
	fsErr error
}

// OpenDir opens the directory at path (a link to a directory is followed:
// the directory itself is named by the config, which root writes).
func OpenDir(path string) (*Dir, error) {
	fd, err := retryEINTR(func() (int, error) {
		return unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if errors.Is(err, unix.ENOTDIR) {
		return nil, &Error{Path: path, Reason: "is not a directory", Err: err}
	}
	if err != nil {
		return nil, openError(path, err, "")
	}
	d := &Dir{path: path, clean: filepath.Clean(path), f: os.NewFile(uintptr(fd), path), fd: fd}
	d.fsErr = checkFS(path, fd)
	return d, nil
}

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Path is the directory's path as given to OpenDir.
func (d *Dir) Path() string { return d.path }

// ReadDir lists the directory, as os.ReadDir does, sorted by name.
func (d *Dir) ReadDir() ([]fs.DirEntry, error) {
	if _, err := d.f.Seek(0, 0); err != nil {
		return nil, err
	}
	entries, err := d.f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}

// Stat returns the identity of name in the directory, following links (it
// is what a read would open, or something that fails to open).
func (d *Dir) Stat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(d.fd, name, &st, 0)
	return st, err
}

// ReadFile reads name, a file in the directory, under r. A link is
// followed only while it resolves inside the directory (an absolute link,
// or one climbing out with "..", is refused), whatever r.FollowLinks says.
// It returns the file's fstat as well, the identity of what was read.
func (d *Dir) ReadFile(name string, r Rules) ([]byte, unix.Stat_t, error) {
	path := JoinName(d.clean, name)
	how := &unix.OpenHow{
		Flags:   uint64(openFlags),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	fsChecked := true
	fd, err := retryEINTR(func() (int, error) { return unix.Openat2(d.fd, name, how) })
	if errors.Is(err, unix.EXDEV) {
		// On another mount inside the directory (a bind mount), or a link
		// out of it: again without NO_XDEV, the file's own filesystem
		// checked, so each gets its own reason.
		fsChecked = false
		how.Resolve &^= unix.RESOLVE_NO_XDEV
		fd, err = retryEINTR(func() (int, error) { return unix.Openat2(d.fd, name, how) })
	}
	if errors.Is(err, unix.ENOSYS) {
		// Linux before 5.6: no link is followed at all, and the file's
		// own filesystem is checked.
		fsChecked = false
		fd, err = retryEINTR(func() (int, error) { return unix.Openat(d.fd, name, openFlags|unix.O_NOFOLLOW, 0) })
	}
	if err != nil {
		return nil, unix.Stat_t{}, openError(path, err, d.path)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, st, &Error{Path: path, Reason: "cannot be examined: " + err.Error(), Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil, st, &Error{Path: path, Reason: "is not a regular file (a directory)", Err: ErrIsDir}
	}
	if fsChecked && d.fsErr != nil {
		return nil, st, &Error{Path: path, Reason: d.fsErr.(*Error).Reason, Err: d.fsErr.(*Error).Err}
	}
	b, err := readStat(path, fd, r, &st, !fsChecked)
	return b, st, err
}

// JoinName is filepath.Join(dir, name) for a dir that is clean already
// (filepath.Clean leaves it as it is), without cleaning it again where
// name is one plain name (no '/', not "." or ".."), as a directory's
// entries are: a register of thousands of files joins each one.
func JoinName(dir, name string) string {
	if name == "" || name == "." || name == ".." || dir == "" || strings.IndexByte(name, '/') >= 0 {
		return filepath.Join(dir, name)
	}
	switch dir {
	case ".":
		return name
	case "/":
		return "/" + name
	}
	return dir + "/" + name
}

// ErrIsDir is the error of a Dir.ReadFile that opened a directory, which a
// caller listing a directory may pass over.
var ErrIsDir = errors.New("is a directory")

func openError(path string, err error, dir string) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return &Error{Path: path, Reason: "is a symbolic link, which is not followed here; name the file itself", Err: err}
	case errors.Is(err, unix.EXDEV) && dir != "":
		return &Error{Path: path, Reason: "is a symbolic link that leads out of " + dir + "; only links to files inside it are followed", Err: err}
	case errors.Is(err, unix.ENOENT):
		return &Error{Path: path, Reason: "does not exist", Err: fs.ErrNotExist}
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return &Error{Path: path, Reason: "cannot be read: permission denied", Err: fs.ErrPermission}
	case errors.Is(err, unix.ENOTDIR):
		return &Error{Path: path, Reason: "has a component that is not a directory", Err: err}
	}
	return &Error{Path: path, Reason: "cannot be opened: " + err.Error(), Err: err}
}

// Filesystems whose files are not files: the kernel's own views and FUSE,
// where every read is answered by some process.
var pseudoFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "procfs",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	0x62656570:               "configfs", // CONFIGFS_MAGIC, not in x/sys/unix
	unix.BPF_FS_MAGIC:        "bpffs",
	unix.FUSE_SUPER_MAGIC:    "FUSE",
	unix.CGROUP_SUPER_MAGIC:  "cgroupfs",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2fs",
}

func readFD(path string, fd int, r Rules) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &Error{Path: path, Reason: "cannot be examined: " + err.Error(), Err: err}
	}
	return readStat(path, fd, r, &st, true)
}

// checkFS refuses a file descriptor on a filesystem whose files are not
// files (pseudoFS).
func checkFS(path string, fd int) error {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return &Error{Path: path, Reason: "cannot be examined: " + err.Error(), Err: err}
	}
	if name, bad := pseudoFS[int64(sfs.Type)]; bad {
		return refuse(path, "is on %s, which holds no configuration files", name)
	}
	return nil
}

// readStat reads fd, whose fstat is st, under r; checkFs checks its
// filesystem too. A regular file read short of the buffer (its size, and
// a byte to spare) is at its end: no second read is needed to see it.
func readStat(path string, fd int, r Rules, st *unix.Stat_t, checkFs bool) ([]byte, error) {
	if err := Check(path, st, r); err != nil {
		return nil, err
	}
	if checkFs {
		if err := checkFS(path, fd); err != nil {
			return nil, err
		}
	}
	max := r.MaxSize
	if max <= 0 {
		max = 1
	}
	buf := make([]byte, 0, min(st.Size, max)+1)
	for {
		if int64(len(buf)) > max {
			return nil, refuse(path, "is too big (over %d bytes; at most %s)", max, size(max))
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			// A regular file never says this; something that does is not
			// one, whatever fstat said.
			return nil, refuse(path, "would block on read; not a regular file")
		}
		if err != nil {
			return nil, &Error{Path: path, Reason: "cannot be read: " + err.Error(), Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		short := len(buf)+n < cap(buf)
		buf = buf[:len(buf)+n]
		if short {
			return buf, nil
		}
	}
}

// Check applies r's fstat checks to st, the status of the file at path.
func Check(path string, st *unix.Stat_t, r Rules) error {
	mode := st.Mode
	perm := fs.FileMode(mode & 0o777)
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return &Error{Path: path, Reason: "is not a regular file (a directory)", Err: ErrIsDir}
	case unix.S_IFIFO:
		return refuse(path, "is not a regular file (a FIFO)")
	case unix.S_IFCHR, unix.S_IFBLK:
		return refuse(path, "is not a regular file (a device)")
	case unix.S_IFSOCK:
		return refuse(path, "is not a regular file (a socket)")
	case unix.S_IFLNK:
		return refuse(path, "is a symbolic link, which is not followed here; name the file itself")
	default:
		return refuse(path, "is not a regular file")
	}
	if r.MaxSize > 0 && st.Size > r.MaxSize {
		return refuse(path, "is too big (%d bytes; at most %s)", st.Size, size(r.MaxSize))
	}
	if perm&0o002 != 0 {
		return refuse(path, "is writable by others (mode %04o); chmod o-w it", perm)
	}
	if r.Private && perm&0o077 != 0 {
		return refuse(path, "is readable by group or others (mode %04o); chmod 600 it", perm)
	}
	if r.RootOwned && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return refuse(path, "is owned by uid %d, not root; whoever owns a key file can replace the key (chown root it)", st.Uid)
	}
	return nil
}

func size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// writeTemp writes data to a new temporary file in dir and closes it,
// returning its name. It holds syscall.ForkLock while the file is open, so
// no child forked meanwhile (a hook the daemon starts) holds a copy of the
// descriptor until its exec: that copy's close would come after the rename,
// and a directory watch would see the renamed file "written in place"
// (IN_CLOSE_WRITE of path), as the port file's test saw under load.
func writeTemp(dir string, data []byte, mode fs.FileMode) (string, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	f, err := os.CreateTemp(dir, ".nodeagent-*")
	if err != nil {
		return "", err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return f.Name(), err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return f.Name(), err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return f.Name(), err
	}
	return f.Name(), f.Close()
}

func retryEINTR(f func() (int, error)) (int, error) {
	for {
		fd, err := f()
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// WriteFile replaces path with data so that a reader sees the old content
// or the new, never half of either, and the new content survives a crash
// once WriteFile returns: a temporary file in the same directory is
// written, synced, given mode, renamed over path, and the directory synced.
func WriteFile(path string, data []byte, mode fs.FileMode) error {
	dir := filepath.Dir(path)
	name, err := writeTemp(dir, data, mode)
	if name != "" {
		defer os.Remove(name)
	}
	if err != nil {
		return err
	}
	if err := os.Rename(name, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
