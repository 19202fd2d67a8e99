// Package sysctl converges network sysctls (forwarding, rp_filter,
// src_valid_mark and any other net.* key) with the Observe/Plan/Apply shape
// every nodeagent subsystem has (DESIGN.md §2).
//
// Keys use sysctl(8) syntax: '.' separates path segments and '/' inside a
// segment stands for a '.' in the file name, so the rp_filter of VLAN
// enp1s0.50 is net.ipv4.conf.enp1s0/50.rp_filter. A segment containing '*'
// is a glob over the entries that exist when the kernel is observed:
// net.ipv6.conf.*.forwarding covers all, default and every interface present
// then, and an interface created later is covered by the next sync. A key
// written out literally beats a glob that also matches it, and a glob with
// fewer '*' segments beats one with more.
//
// Sysctls are verified, then set: a key that already has its value is never
// written, so a config that matches a read-only /proc/sys (a container)
// converges without error. Values are compared field by field, ignoring
// whitespace ("1\n" is 1; ip_local_port_range prints a tab), and decimal
// integers numerically.
//
// A per-interface key (net.*.conf.IFACE.* or net.*.neigh.IFACE.*) whose
// interface does not exist yet, typically a VLAN another subsystem creates
// in the same sync, is pending: Apply reports it as a host.PendingError and sets
// the other keys. Any other key that does not exist is an error.
//
// Files under /proc/sys/net belong to the network namespace of the thread
// that opens them, so every read and write runs inside host.Host.Do.
//
// Ownership and teardown: a sysctl is not an object nodeagent creates, and
// nothing records the value it had before nodeagent set it, so teardown
// does not revert sysctls, and a key that leaves the config keeps its
// current value. Both stay until something else changes them or the node
// reboots.
package sysctl

import (
	"errors"
	"fmt"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"maps"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultRoot is where keys map to files when Desired.Root is empty.
const DefaultRoot = "/proc/sys"

// Desired is the whole desired state of this subsystem.
type Desired struct {
	// Root is the directory keys map to; "" means DefaultRoot. Tests point
	// it elsewhere.
	Root string
	// Values maps keys in sysctl(8) form, which may contain glob segments,
	// to their values.
	Values map[string]string
}

// Equal reports whether d and e want the same values under the same root.
func (d Desired) Equal(e Desired) bool {
	return d.root() == e.root() && maps.Equal(d.Values, e.Values)
}

func (d Desired) root() string {
	if d.Root == "" {
		return DefaultRoot
	}
	return d.Root
}

// ObservedKey is one concrete key (no globs) as the kernel has it.
type ObservedKey struct {
	// Exists reports whether the file exists.
	Exists bool
	// Raw is the file's content as read, trailing newline included.
	Raw string
	// Unreadable says why an existing key could not be read; "" when it was.
	Unreadable string
	// Iface is, for a missing per-interface key whose interface has no
	// entry, that interface's name; IfaceExists reports whether a link of
	// that name exists in the namespace.
	Iface       string
	IfaceExists bool
}

// Observed is the kernel state of every key Desired names, with its globs
// expanded.
type Observed struct {
	// Keys holds every concrete key Desired names or a glob matched.
	Keys map[string]ObservedKey
	// Matches maps each glob key of Desired to the concrete keys it
	// matched, sorted.
	Matches map[string][]string
	// Coming are the interfaces another subsystem creates in the same
	// sync (set by the caller, not read from the kernel): their keys are
	// planned as set, not pending, and a glob over interfaces covers them.
	Coming []string
}

// Action is the first column of a plan line.
type Action byte

// Plan line actions, as in `nodeagent plan`. Sysctls are never added or
// removed, only changed.
const (
	Change Action = '~'
	Fail   Action = '!'
)

// OpKind says what an Op does.
type OpKind int

// The operations a plan is made of.
const (
	OpSet     OpKind = iota
	OpPending        // not applied: the interface the key names does not exist yet
	OpFail           // not applied: reported as a failure for its key
)

// Op is one change to (or one problem with) one key.
type Op struct {
	Kind OpKind
	// Key is a concrete key in sysctl(8) form, or the configured key when
	// it is invalid or a glob that matched nothing.
	Key string
	// Old is the observed value, normalised; New is the value to write.
	Old, New string
	// Reason explains a pending or failed op.
	Reason string
	// NewIface marks a set of a key of an interface this sync creates: its
	// value is not known until it exists.
	NewIface bool
}

// Action returns the op's plan symbol.
func (o Op) Action() Action {
	if o.Kind == OpSet {
		return Change
	}
	return Fail
}

// Object names the key, for errors and status.
func (o Op) Object() string { return "sysctl " + o.Key }

func (o Op) String() string {
	switch {
	case o.Kind == OpSet && o.NewIface:
		return fmt.Sprintf("%c %s (new interface) -> %s", o.Action(), o.Object(), show(normalize(o.New)))
	case o.Kind == OpSet:
		return fmt.Sprintf("%c %s %s -> %s", o.Action(), o.Object(), show(o.Old), show(normalize(o.New)))
	case o.Kind == OpPending:
		return fmt.Sprintf("%c %s: pending: %s", o.Action(), o.Object(), o.Reason)
	}
	return fmt.Sprintf("%c %s: %s", o.Action(), o.Object(), o.Reason)
}

// Entry is the op as a line of the sync's report.
func (o Op) Entry() plan.Entry {
	e := plan.Entry{Subsystem: plan.Sysctls, Kind: plan.KindSysctl, Action: plan.Action(o.Action()), Object: o.Object(), Text: o.String()}
	if o.Kind != OpSet {
		e.Err = o.err()
	}
	return e
}

// Report is the plan as report entries, one per op; ops that cannot be
// applied carry their reason as the error.
func (p Plan) Report() plan.Report { return plan.ReportOf(p.Ops) }

// err is the op's error when it cannot be applied.
func (o Op) err() error {
	if o.Kind == OpPending {
		return fmt.Errorf("%s: %w", o.Object(), &host.PendingError{Reason: o.Reason})
	}
	return fmt.Errorf("%s: %w", o.Object(), errors.New(o.Reason))
}

// Plan is an ordered list of ops. The zero Plan changes nothing.
type Plan struct {
	plan.Ops[Op]
	// Desired and Observed are what the plan was made from; Apply uses
	// Desired to find files and to observe the result.
	Desired  Desired
	Observed Observed
}

// parseKey splits a key in sysctl(8) form into file names: '.' separates
// them and '/' stands for '.' inside one.
func parseKey(key string) ([]string, error) {
	if !strings.HasPrefix(key, "net.") {
		return nil, errors.New("outside net.*; nodeagent manages only network sysctls")
	}
	segs := strings.Split(key, ".")
	for i, s := range segs {
		name := strings.ReplaceAll(s, "/", ".")
		switch {
		case s == "":
			return nil, errors.New("empty segment")
		case name == "." || name == "..":
			return nil, fmt.Errorf("segment %q is not a file name", s)
		case strings.ContainsAny(s, "?[]\\\x00\n"):
			return nil, fmt.Errorf("segment %q: only '*' may be used as a glob", s)
		}
		if _, err := path.Match(name, ""); err != nil {
			return nil, fmt.Errorf("segment %q: %w", s, err)
		}
		segs[i] = name
	}
	return segs, nil
}

// keyOf is the inverse of parseKey.
func keyOf(names []string) string {
	segs := make([]string, len(names))
	for i, n := range names {
		segs[i] = strings.ReplaceAll(n, ".", "/")
	}
	return strings.Join(segs, ".")
}

func pathOf(root string, names []string) string {
	return filepath.Join(append([]string{root}, names...)...)
}

func globs(names []string) int {
	n := 0
	for _, s := range names {
		if strings.Contains(s, "*") {
			n++
		}
	}
	return n
}

// perIface reports whether names is a per-interface key
// (net.FAMILY.conf|neigh.IFACE.…).
func perIface(names []string) bool {
	return len(names) >= 5 && (names[2] == "conf" || names[2] == "neigh")
}

// rank orders keys so that a write that propagates runs before the writes
// it would otherwise undo: ip_forward sets conf.all.forwarding, and writing
// conf.all.forwarding sets it on default and every interface.
func rank(key string) int {
	segs := strings.Split(key, ".")
	if len(segs) < 5 || (segs[2] != "conf" && segs[2] != "neigh") {
		return 0
	}
	switch segs[3] {
	case "all":
		return 1
	case "default":
		return 2
	}
	return 3
}

// normalize joins a value's whitespace-separated fields with one space.
func normalize(v string) string { return strings.Join(strings.Fields(v), " ") }

// equalValue reports whether two values are the same, field by field,
// comparing decimal integers numerically.
func equalValue(a, b string) bool {
	fa, fb := strings.Fields(a), strings.Fields(b)
	if len(fa) != len(fb) {
		return false
	}
	for i := range fa {
		if fa[i] == fb[i] {
			continue
		}
		x, errx := strconv.ParseInt(fa[i], 10, 64)
		y, erry := strconv.ParseInt(fb[i], 10, 64)
		if errx != nil || erry != nil || x != y {
			return false
		}
	}
	return true
}

// show prints a normalised value for a plan line or an error, quoted when
// it is empty or has several fields.
func show(v string) string {
	if v == "" || strings.Contains(v, " ") {
		return strconv.Quote(v)
	}
	return v
}
