package hazard

import (
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Paths says where to read; Root "" is the node's own filesystem, tests
// point it at a fixture tree.
type Paths struct {
	Root string
}

func (p Paths) path(elem ...string) string {
	return filepath.Join(append([]string{p.Root, "/"}, elem...)...)
}

// confDirs are systemd's CONF_PATHS for a version, highest priority first:
// a file in one hides a file of the same name in the later ones. Before 255
// Debian builds systemd with split-usr, which adds /lib (252's def.h,
// _CONF_PATHS_SPLIT_USR); 255 removed split-usr.
func confDirs(v int) []string {
	dirs := []string{"/etc", "/run", "/usr/local/lib", "/usr/lib"}
	if v != 0 && v < 255 {
		dirs = append(dirs, "/lib")
	}
	return dirs
}

// SearchDirs are the directories networkd and udev read, for the newest
// systemd; confDirs says which a version reads.
var SearchDirs = []string{"/etc/systemd", "/run/systemd", "/usr/local/lib/systemd", "/usr/lib/systemd", "/lib/systemd"}

// maxFile bounds what is read of one configuration file.
const maxFile = 1 << 20

// listConf is systemd's conf_files_list_strv(suffix, dirs/sub, flags 0):
// the files ending in suffix in each directory, one per file name (the
// earliest directory's), sorted by file name. A name whose file is empty
// or a link to /dev/null stays in the list: the caller skips it, as
// network_load_one() and link_load_one() do ("Skipping empty file"), and
// it hides the later directories' file of that name all the same.
func (p Paths) listConf(dirs []string, sub, suffix string) []string {
	byName := map[string]string{}
	for _, d := range dirs {
		dir := p.path(d, sub)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			name := e.Name()
			if !strings.HasSuffix(name, suffix) {
				continue
			}
			if _, seen := byName[name]; !seen {
				byName[name] = filepath.Join(dir, name)
			}
		}
	}
	out := make([]string, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[name])
	}
	return out
}

// dropIns are the drop-ins of a file: dir/<dropinDir>/*.conf across the
// search path (config_get_dropin_files()), in file-name order.
func (p Paths) dropIns(dirs []string, sub, dropinDir string) []string {
	return p.listConf(dirs, filepath.Join(sub, dropinDir), ".conf")
}

// reader is who reads a file: networkd reads as the systemd-network user
// (its unit's User=, without CAP_DAC_OVERRIDE), udevd as root.
type reader struct {
	root bool
	uid  uint32
	gids []uint32
}

var asRoot = reader{root: true}

// fileState is what systemd makes of one configuration file before
// parsing it.
type fileState int

const (
	fileOK      fileState = iota
	fileEmpty             // empty or /dev/null: skipped, a mask
	fileMissing           // gone (ENOENT): config_parse() skips it
	fileRefused           // cannot be opened or read: the whole unit fails
	// fileUnknown is a file its reader may read and nodeagent may not
	// (another user's, mode 0600, and nodeagent runs without
	// CAP_DAC_OVERRIDE): what it says is not known.
	fileUnknown
)

// readConf reads a configuration file as systemd opens it (following
// links; fopen(), then fstat()), for r: an empty file or a character
// device (/dev/null) is a mask; a file r may not read, or one that is not
// regular, fails. At most maxFile bytes are read: a file beyond that is
// refused, as systemd would have refused its long line.
func readConf(path string, r reader) ([]byte, fileState) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fileMissing
		}
		if st, serr := os.Stat(path); errors.Is(err, os.ErrPermission) && serr == nil && st.Mode().IsRegular() && st.Size() > 0 && r.mayRead(st) {
			return nil, fileUnknown
		}
		return nil, fileRefused
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fileRefused
	}
	if st.Mode()&os.ModeCharDevice != 0 || (st.Mode().IsRegular() && st.Size() == 0) {
		return nil, fileEmpty
	}
	if !st.Mode().IsRegular() || !r.mayRead(st) {
		return nil, fileRefused
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil || len(b) > maxFile {
		return nil, fileRefused
	}
	return b, fileOK
}

// mayRead reports whether r may open a file of that owner and mode.
func (r reader) mayRead(st os.FileInfo) bool {
	if r.root {
		return true
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	mode := st.Mode().Perm()
	switch {
	case sys.Uid == r.uid:
		return mode&0o400 != 0
	case slices.Contains(r.gids, sys.Gid):
		return mode&0o040 != 0
	}
	return mode&0o004 != 0
}

// parseMany reads a file and its drop-ins as config_parse_many()
// reads them: the main file first, then each drop-in in order.
func parseMany(files []string, r reader) (as []assignment, state fileState) {
	for i, f := range files {
		b, st := readConf(f, r)
		switch st {
		case fileEmpty, fileMissing:
			if i == 0 {
				return nil, st
			}
			continue
		case fileRefused, fileUnknown:
			return nil, st
		}
		more, err := parseINI(b)
		if err != nil {
			return nil, fileRefused
		}
		for j := range more {
			more[j].file = f
		}
		as = append(as, more...)
	}
	return as, fileOK
}
