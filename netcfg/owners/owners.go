// Package owners finds which network configuration software made a link
// nodeagent is to take over, from its files: systemd-networkd (.netdev and
// .network), netplan (YAML, rendered by networkd or NetworkManager),
// ifupdown (/etc/network/interfaces and what it sources) and
// NetworkManager (keyfiles). Each owner comes with the exact step that
// retires it without touching the link now: a file to remove, lines to
// comment out, a profile to delete once NetworkManager has let go. After
// those steps and a reboot the link is nodeagent's alone.
//
// It reads files only (never runs networkctl, netplan, ifquery or nmcli),
// each opened without following a link, checked and size-capped
// (netcfg/fsafe); a problem names the file and never quotes it.
package owners

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
)

// The owners' names, as steps and comments print them.
const (
	Networkd       = "systemd-networkd"
	Netplan        = "netplan"
	Ifupdown       = "ifupdown"
	NetworkManager = "NetworkManager"
)

// Owner is one file (or stanza) that makes or configures a link.
type Owner struct {
	// Kind is Networkd, Netplan, Ifupdown or NetworkManager.
	Kind string `json:"kind"`
	// Link is the link's name.
	Link string `json:"link"`
	// File is the file's path on the node (/etc/systemd/network/x.netdev).
	File string `json:"file"`
	// First and Last are the stanza's lines (1-based, inclusive) where the
	// step edits a file rather than removes it: a netplan entry, an
	// ifupdown stanza, a parent's VLAN= line.
	First int `json:"first,omitempty"`
	Last  int `json:"last,omitempty"`
	// Makes says the file creates the link (a .netdev, a netplan vlans:
	// entry, an ifupdown stanza, a NetworkManager profile); otherwise it
	// configures it (a .network matching it, a parent's VLAN= line).
	Makes bool `json:"makes,omitempty"`
	// Role says what the file is to the link, for comments: "the
	// .netdev that creates it", "its parent's .network (VLAN=)".
	Role string `json:"role"`
	// Manual says no command retires it: the file does more than make
	// the link (a [Match] that matches other links too, an auto line
	// naming others), and the step asks for an edit that Role describes.
	Manual bool `json:"manual,omitempty"`
	// ID and UUID are a NetworkManager profile's.
	ID   string `json:"id,omitempty"`
	UUID string `json:"uuid,omitempty"`
	// Renderer is a netplan file's renderer: networkd or NetworkManager.
	Renderer string `json:"renderer,omitempty"`
}

// maxFile bounds one configuration file read.
const maxFile = 1 << 20

// maxFiles bounds the files read in one directory.
const maxFiles = 4096

var rules = fsafe.Rules{MaxSize: maxFile}

// reader reads the files under etc, which stands for /etc.
type reader struct {
	etc      string
	links    map[string]bool
	out      []Owner
	problems []string
}

// Read returns the owners of the named links found under etc (the
// directory that stands for /etc), in the order the steps retire them,
// and what could not be read (one line each, never a file's contents).
// A missing file or directory is no problem.
func Read(etc string, links []string) ([]Owner, []string) {
	r := &reader{etc: etc, links: map[string]bool{}}
	for _, l := range links {
		r.links[l] = true
	}
	if len(r.links) == 0 {
		return nil, nil
	}
	r.networkd()
	r.netplan()
	r.ifupdown()
	r.networkManager()
	slices.SortStableFunc(r.out, func(a, b Owner) int {
		return strings.Compare(a.Link, b.Link)
	})
	return r.out, r.problems
}

// nodePath is p (under etc) as the node names it.
func (r *reader) nodePath(p string) string {
	rel, err := filepath.Rel(r.etc, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		return p
	}
	return path.Join("/etc", filepath.ToSlash(rel))
}

func (r *reader) problem(err error) {
	r.problems = append(r.problems, strings.ReplaceAll(err.Error(), "\n", " "))
}

// read reads one file, or reports it; a missing one is nil, false.
func (r *reader) read(p string) ([]byte, bool) {
	b, err := fsafe.ReadFile(p, rules)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.problem(err)
		}
		return nil, false
	}
	return b, true
}

// list returns the regular files of dir ending in one of exts (all when
// none), sorted by name; links and dotfiles are left out, and a link
// ending in an ext is reported (not followed).
func (r *reader) list(dir string, exts ...string) []string {
	d, err := fsafe.OpenDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.problem(err)
		}
		return nil
	}
	defer d.Close()
	entries, err := d.ReadDir()
	if err != nil {
		r.problems = append(r.problems, fmt.Sprintf("%s: cannot list: %v", r.nodePath(dir), err))
		return nil
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") || (len(exts) > 0 && !slices.ContainsFunc(exts, func(x string) bool { return strings.HasSuffix(n, x) })) {
			continue
		}
		if e.Type()&fs.ModeSymlink != 0 {
			r.problems = append(r.problems, r.nodePath(filepath.Join(dir, n))+" is a symbolic link, which is not followed")
			continue
		}
		if !e.Type().IsRegular() {
			continue
		}
		if len(out) == maxFiles {
			r.problems = append(r.problems, fmt.Sprintf("%s: more than %d files; the rest are not read", r.nodePath(dir), maxFiles))
			break
		}
		out = append(out, filepath.Join(dir, n))
	}
	return out
}

// Steps are the steps that retire a link's owners, in order, each one
// shell line with a comment, for the switch-over before nodeagent starts:
// none of them changes the link now (no networkctl reload, netplan apply,
// ifdown or connection down, which would delete or reconfigure it), and
// an edit comments lines out rather than deleting them, so the line
// numbers printed stay right; the reboot that ends the switch-over is
// when each owner stops making the link.
func Steps(owners []Owner) []string {
	var st []string
	add := func(s string) {
		if !slices.Contains(st, s) {
			st = append(st, s)
		}
	}
	// NetworkManager lets go of the link first, at once and without
	// touching it; deleting its profile while it holds the link would
	// take the link down.
	for _, o := range owners {
		if o.Kind == NetworkManager || o.Kind == Netplan && o.Renderer == "NetworkManager" {
			add(fmt.Sprintf("nmcli device set %s managed no   # NetworkManager lets go of %s now and leaves it as it is", shellWord(o.Link), o.Link))
		}
	}
	for _, o := range owners {
		switch {
		case o.Manual:
			add(fmt.Sprintf("edit %s   # %s: %s%s", shellWord(o.File), o.Kind, o.Role, dont(o)))
		case o.Kind == NetworkManager:
			add(fmt.Sprintf("nmcli connection delete %s   # %s's profile %q (%s), now that %s is unmanaged; %s stays", o.UUID, NetworkManager, o.ID, o.File, o.Link, o.Link))
		case o.First > 0:
			lines := fmt.Sprintf("line %d", o.First)
			sed := fmt.Sprint(o.First)
			if o.Last > o.First {
				lines = fmt.Sprintf("lines %d-%d", o.First, o.Last)
				sed = fmt.Sprintf("%d,%d", o.First, o.Last)
			}
			add(fmt.Sprintf("sed -i '%ss/^/#/' %s   # %s: comment out %s (%s)%s", sed, shellWord(o.File), o.Kind, o.Role, lines, dont(o)))
		default:
			add(fmt.Sprintf("rm %s   # %s: %s%s", shellWord(o.File), o.Kind, o.Role, dont(o)))
		}
	}
	return st
}

// dont is what the operator must not run now for o's owner, as the end of
// a step's comment.
func dont(o Owner) string {
	switch o.Kind {
	case Networkd:
		return "; no networkctl reload now (it would reconfigure the link)"
	case Netplan:
		return "; do NOT run netplan apply (the reboot applies it)"
	case Ifupdown:
		return fmt.Sprintf("; do NOT run ifdown %s (it deletes the link)", o.Link)
	}
	return ""
}

// shellWord quotes s for a shell where it needs it.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:@%,=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
