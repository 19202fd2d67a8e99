// Package dependents finds the links of other network namespaces whose
// lower device is a link of this one: the macvlan (or ipvlan) links that a
// CNI plugin gave pods on a node's VLAN. The kernel deletes such a link
// with its lower device, so a link that has them cannot be deleted without
// cutting the pods off, and from the link's own namespace nothing shows
// them: each namespace on the host has to be asked.
package dependents

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Link is a link of another namespace that sits on one of ours.
type Link struct {
	// Parent is the ifindex, in our namespace, of its lower device.
	Parent int
	// Name and Kind are the link's (net1, macvlan).
	Name, Kind string
	// Where names its namespace: "netns NAME" (a bind mount under
	// /run/netns, as CNI runtimes and ip-netns make) or "pid N (COMM)".
	Where string
}

// String is "KIND NAME in WHERE". Names come from other namespaces and
// from /run/netns, so a byte that is not printable ASCII is shown as '?'.
func (l Link) String() string {
	return printable(fmt.Sprintf("%s %s in %s", l.Kind, l.Name, l.Where))
}

func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, s)
}

// MaxNamespaces bounds the namespaces one Find looks at; a host has one
// per pod and a few more.
const MaxNamespaces = 10_000

// namedDirs hold the named namespaces: ip-netns's, and those of CNI
// runtimes (containerd, CRI-O), which bind-mount them there too.
var namedDirs = []string{"/run/netns", "/var/run/netns"}

// Find returns the links of the host's other network namespaces whose
// lower device is one of parents (ifindexes in self; netns.None() is the
// calling thread's namespace), ordered by parent, then where.
func Find(ctx context.Context, self netns.NsHandle, parents []int) ([]Link, error) {
	if len(parents) == 0 {
		return nil, nil
	}
	selfFd := int(self)
	if !self.IsOpen() {
		h, err := netns.GetFromPath("/proc/thread-self/ns/net")
		if err != nil {
			return nil, fmt.Errorf("own network namespace: %w", err)
		}
		defer h.Close()
		selfFd = int(h)
	}
	var st unix.Stat_t
	if err := unix.Fstat(selfFd, &st); err != nil {
		return nil, fmt.Errorf("own network namespace: %w", err)
	}
	seen := map[[2]uint64]bool{{st.Dev, st.Ino}: true}
	var out []Link
	var errs []error
	look := func(path, where string) {
		// O_NONBLOCK: a FIFO put where a namespace should be must not
		// hold the open up.
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err != nil {
			return // a process that ended, a mount that went
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		var sfs unix.Statfs_t
		if unix.Fstat(fd, &st) != nil || unix.Fstatfs(fd, &sfs) != nil || sfs.Type != unix.NSFS_MAGIC {
			return // not a namespace
		}
		key := [2]uint64{st.Dev, st.Ino}
		if seen[key] {
			return
		}
		seen[key] = true
		links, err := linksOn(netns.NsHandle(fd), selfFd, parents, where)
		if err != nil && len(errs) < 5 {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		out = append(out, links...)
	}
	n := 0
	for _, dir := range namedDirs {
		names, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, p := range names {
			if n++; n > MaxNamespaces || ctx.Err() != nil {
				break
			}
			look(p, "netns "+filepath.Base(p))
		}
	}
	pids, _ := os.ReadDir("/proc")
	for _, e := range pids {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if n++; n > MaxNamespaces || ctx.Err() != nil {
			break
		}
		look(filepath.Join("/proc", e.Name(), "ns", "net"), "pid "+strconv.Itoa(pid)+comm(pid))
	}
	if err := ctx.Err(); err != nil {
		return out, fmt.Errorf("looking for links on ours in other network namespaces: %w", err)
	}
	slices.SortFunc(out, func(a, b Link) int {
		if a.Parent != b.Parent {
			return a.Parent - b.Parent
		}
		return strings.Compare(a.Where+a.Name, b.Where+b.Name)
	})
	return out, errors.Join(errs...)
}

// linksOn lists the links of ns whose lower device is one of parents in
// the namespace selfFd.
func linksOn(ns netns.NsHandle, selfFd int, parents []int, where string) ([]Link, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	// The id this namespace gave ours: a link whose lower device is in
	// ours carries it (IFLA_LINK_NETNSID). None: no link of it can be.
	id, err := h.GetNetNsIdByFd(selfFd)
	if err != nil || id < 0 {
		return nil, nil
	}
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	var out []Link
	for _, l := range links {
		a := l.Attrs()
		if a.NetNsID == id && slices.Contains(parents, a.ParentIndex) && onLower[l.Type()] {
			out = append(out, Link{Parent: a.ParentIndex, Name: a.Name, Kind: l.Type(), Where: where})
		}
	}
	return out, nil
}

// onLower are the kinds of link whose IFLA_LINK is their lower device,
// which the kernel deletes them with. (A veth's is its peer: the pair is
// one link, never one of nodeagent's.)
var onLower = map[string]bool{"macvlan": true, "macvtap": true, "ipvlan": true, "ipvtap": true, "vlan": true}

// comm is " (COMM)" of a process, "" when it cannot be read. The kernel
// gives at most 16 bytes; String makes them printable.
func comm(pid int) string {
	fd, err := unix.Open(filepath.Join("/proc", strconv.Itoa(pid), "comm"), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	b := make([]byte, 32)
	n, err := unix.Read(fd, b)
	if err != nil || n <= 0 {
		return ""
	}
	return " (" + strings.TrimSpace(string(b[:n])) + ")"
}

// MaxListed bounds the links a Refusal names.
const MaxListed = 20

// Refusal is the error that refuses to delete the links deps sit on:
// what (teardown, release) would delete them, and the kernel the links
// of deps with them. names maps the parents' ifindexes to their names;
// fix is the error's last line, what to do instead. Nil when deps is
// empty.
func Refusal(deps []Link, names map[int]string, what, fix string) error {
	if len(deps) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d link(s) of other network namespaces (pods) sit on links %s would delete, and the kernel would delete them too:", len(deps), what)
	for i, d := range deps {
		if i == MaxListed {
			fmt.Fprintf(&b, "\n  and %d more", len(deps)-i)
			break
		}
		fmt.Fprintf(&b, "\n  %s: %s", printable(names[d.Parent]), d)
	}
	b.WriteString("\n" + fix)
	return errors.New(b.String())
}
