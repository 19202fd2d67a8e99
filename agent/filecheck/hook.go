package filecheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// SandboxHidden are the trees nodeagent.service's sandbox hides from the
// daemon: ProtectHome=yes (/home, /root, /run/user) and PrivateTmp=yes
// (/tmp, /var/tmp, private and empty). A hook there validates on the
// command line and is not found when the daemon runs it.
var SandboxHidden = []string{"/home", "/root", "/run/user", "/tmp", "/var/tmp"}

// ShippedHooks are the port hooks the package ships (packaging/examples/
// hooks): their --credentials file is in netcfg/cred's format, which
// validate checks.
var ShippedHooks = []string{"qbittorrent-port", "transmission-port"}

// HookCredentials is the --credentials file of an onChange that runs a
// shipped hook (ShippedHooks, by the first word's base name), or "".
func HookCredentials(argv []string) string {
	if len(argv) == 0 || !slices.Contains(ShippedHooks, filepath.Base(argv[0])) {
		return ""
	}
	for i, a := range argv[1:] {
		if v, ok := strings.CutPrefix(a, "--credentials="); ok {
			return v
		}
		if a == "--credentials" && i+2 < len(argv) {
			return argv[i+2]
		}
	}
	return ""
}

// HookProblems are what is wrong with path as a command nodeagent runs as
// root (portForward.onChange's first word), checked as a key file is:
// it must exist, be a regular file (a link is followed, and its target
// judged), be executable, be owned by root and not writable by group or
// others, sit in directories that only root may change, and not sit
// where the unit's sandbox hides it. Each problem is one message, naming
// the path, without the file's contents.
func HookProblems(path string) []string {
	var out []string
	hidden := func(p string) {
		for _, h := range SandboxHidden {
			if p == h || strings.HasPrefix(p, h+"/") {
				out = append(out, fmt.Sprintf("%s is under %s, which nodeagent.service's sandbox hides from the daemon (ProtectHome=, PrivateTmp=): it would not find it; install the hook under /usr/local/sbin", p, h))
				return
			}
		}
	}
	path = filepath.Clean(path)
	hidden(path)
	target, err := filepath.EvalSymlinks(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return append(out, fmt.Sprintf("%s does not exist", path))
	case err != nil:
		return append(out, fmt.Sprintf("%s: %v", path, err))
	}
	if target != path {
		hidden(target)
	}
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		return append(out, fmt.Sprintf("%s: %v", path, err))
	}
	name := path
	if target != path {
		name = fmt.Sprintf("%s (a link to %s)", path, target)
	}
	mode := os.FileMode(st.Mode & 0o7777)
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return append(out, fmt.Sprintf("%s is not a regular file", name))
	case st.Mode&0o111 == 0:
		out = append(out, fmt.Sprintf("%s is not executable (mode %04o): chmod 0755 it", name, mode))
	}
	if st.Uid != 0 {
		out = append(out, fmt.Sprintf("%s is owned by uid %d, not root: its owner could change what nodeagent runs as root (chown root it)", name, st.Uid))
	}
	if st.Mode&0o022 != 0 {
		out = append(out, fmt.Sprintf("%s is writable by group or others (mode %04o): they could change what nodeagent runs as root (chmod go-w it)", name, mode))
	}
	for dir := filepath.Dir(target); ; dir = filepath.Dir(dir) {
		if msg := dirProblem(dir); msg != "" {
			out = append(out, fmt.Sprintf("%s: %s", name, msg))
			break
		}
		if dir == "/" {
			break
		}
	}
	return out
}

// dirProblem says why someone other than root could replace a file in
// dir: its owner is not root, or group or others may write it (a sticky
// directory, /tmp, lets them replace only their own files).
func dirProblem(dir string) string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Sprintf("directory %s: %v", dir, err)
	}
	mode := os.FileMode(st.Mode & 0o7777)
	switch {
	case st.Uid != 0:
		return fmt.Sprintf("directory %s is owned by uid %d, not root: its owner could replace the hook", dir, st.Uid)
	case st.Mode&0o002 != 0 && st.Mode&unix.S_ISVTX == 0:
		return fmt.Sprintf("directory %s is writable by everyone (mode %04o): anyone could replace the hook", dir, mode)
	case st.Mode&0o020 != 0 && st.Gid != 0 && st.Mode&unix.S_ISVTX == 0:
		return fmt.Sprintf("directory %s is writable by group %d (mode %04o): its members could replace the hook", dir, st.Gid, mode)
	}
	return ""
}
