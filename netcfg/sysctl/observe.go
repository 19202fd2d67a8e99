package sysctl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"golang.org/x/sys/unix"
)

// Observe reads every key d names, expanding globs against the entries that
// exist now. It opens the files inside h's namespace. A key that is missing
// or unreadable is recorded, not returned as an error: MakePlan reports it
// as that key's failure.
func Observe(ctx context.Context, snap *host.Snapshot, d Desired) (Observed, error) {
	h := snap.Host()
	o := Observed{Keys: map[string]ObservedKey{}, Matches: map[string][]string{}}
	root := d.root()
	var missing []string
	err := h.Do(func() error {
		read := func(names []string) {
			key := keyOf(names)
			if _, done := o.Keys[key]; done {
				return
			}
			ok := readKey(pathOf(root, names))
			if !ok.Exists && perIface(names) && names[3] != "all" && names[3] != "default" {
				// The family's conf directory exists but has no entry for
				// the interface: the key is the interface's, not a typo.
				if dirExists(pathOf(root, names[:3])) && !exists(pathOf(root, names[:4])) {
					ok.Iface = names[3]
					missing = append(missing, key)
				}
			}
			o.Keys[key] = ok
		}
		for _, k := range slices.Sorted(maps.Keys(d.Values)) {
			names, err := parseKey(k)
			if err != nil {
				continue // MakePlan reports it
			}
			if globs(names) == 0 {
				read(names)
				continue
			}
			matches, err := expand(root, nil, names)
			if err != nil {
				return fmt.Errorf("sysctl %s: %w", k, err)
			}
			keys := make([]string, 0, len(matches))
			for _, m := range matches {
				read(m)
				keys = append(keys, keyOf(m))
			}
			slices.Sort(keys)
			o.Matches[k] = keys
		}
		return nil
	})
	if err != nil {
		return Observed{}, err
	}
	for _, key := range missing {
		ok := o.Keys[key]
		idx, err := snap.LinkIndex(ok.Iface)
		if err != nil {
			return Observed{}, err
		}
		ok.IfaceExists = idx != 0
		o.Keys[key] = ok
	}
	return o, ctx.Err()
}

// readKey reads one file.
func readKey(p string) ObservedKey {
	b, err := os.ReadFile(p)
	switch {
	case err == nil:
		return ObservedKey{Exists: true, Raw: string(b)}
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, unix.ENOTDIR):
		return ObservedKey{}
	}
	ok := ObservedKey{Exists: true, Unreadable: "cannot be read: " + err.Error()}
	if fi, serr := os.Stat(p); serr == nil {
		switch {
		case fi.IsDir():
			ok.Unreadable = "is a directory, not a key"
		case fi.Mode().Perm()&0o444 == 0:
			ok.Unreadable = "is write-only; nodeagent sets only keys it can read back"
		}
	}
	return ok
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// expand returns the file-name lists that match the glob key rest under
// dir/prefix: every segment but the last must match a directory, the last
// a file. Entries that vanish while it walks simply do not match.
func expand(dir string, prefix, rest []string) ([][]string, error) {
	if len(rest) == 0 {
		return [][]string{slices.Clone(prefix)}, nil
	}
	here := filepath.Join(append([]string{dir}, prefix...)...)
	seg, last := rest[0], len(rest) == 1
	var candidates []string
	if !strings.Contains(seg, "*") {
		fi, err := os.Stat(filepath.Join(here, seg))
		if err != nil || fi.IsDir() == last {
			return nil, nil
		}
		candidates = []string{seg}
	} else {
		entries, err := os.ReadDir(here)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if ok, _ := path.Match(seg, e.Name()); ok && e.IsDir() != last {
				candidates = append(candidates, e.Name())
			}
		}
	}
	var out [][]string
	for _, c := range candidates {
		m, err := expand(dir, append(prefix, c), rest[1:])
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}
