// Package testenv holds what nodeagent's privileged tests stand on: guards
// that skip with a reason, fresh network namespaces bound to netlink handles,
// and (in testenv/vm) the VM runner for what the host kernel lacks.
package testenv

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// InVM reports whether the test runs inside the testenv/vm kernel.
func InVM() bool { return os.Getenv("NODEAGENT_IN_VM") == "1" }

// RequireRoot skips the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: privileged tests are skipped (make test runs them)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, netlink writes); CI runs as root")
	}
}

// RequireModule skips the test unless the kernel has the named feature,
// built in or as a loadable module. The host kernel here lacks 8021q,
// wireguard and dummy; those tests run in the VM tier (make test-vm).
func RequireModule(t testing.TB, name string) {
	t.Helper()
	RequireRoot(t)
	if HasModule(name) {
		return
	}
	t.Skipf("kernel has no %s; this test runs in the VM tier (make test-vm)", name)
}

// HasModule reports whether the kernel has the named module loaded or
// built in, loading it with modprobe when it is available as a module.
func HasModule(name string) bool {
	if _, err := os.Stat("/sys/module/" + name); err == nil {
		return true
	}
	if err := exec.Command("modprobe", name).Run(); err == nil {
		return true
	}
	_, err := os.Stat("/sys/module/" + name)
	return err == nil
}

// NamePrefix starts the name of every namespace NewNetNS makes. A program
// built on testenv (the demo) sets its own, so what it leaves, or not, can
// be told from what tests running beside it make.
var NamePrefix = "na-test-"

// NetNS is a fresh network namespace for one test. It has a name under
// /run/netns so observers like `ip -n NAME` work, and a host.Host bound to it
// so the code under test never changes the test process's own namespace.
type NetNS struct {
	Name   string
	Handle netns.NsHandle
	Host   *host.Host
	// NL is a netlink handle in the namespace for the test's own planting
	// and observing (it does not count as the converger's writes).
	NL *netlink.Handle
}

// NewNetNS creates a namespace with loopback up and removes it when the test
// ends.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	RequireRoot(t)
	var b [4]byte
	rand.Read(b[:])
	name := NamePrefix + hex.EncodeToString(b[:])

	type result struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan result, 1)
	go func() {
		// The new namespace is entered by this thread only; it is switched
		// back before unlocking, or discarded with the goroutine if that fails.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			c <- result{err: err}
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if rerr := netns.Set(orig); rerr != nil {
			c <- result{err: fmt.Errorf("restore netns: %w", rerr)}
			return
		}
		runtime.UnlockOSThread()
		c <- result{h, err}
	}()
	r := <-c
	if r.err != nil {
		t.Fatalf("create netns %s: %v", name, r.err)
	}
	n := &NetNS{Name: name, Handle: r.h}
	t.Cleanup(func() {
		if n.Host != nil {
			n.Host.Close()
		}
		if n.NL != nil {
			n.NL.Close()
		}
		n.Handle.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	var err error
	if n.NL, err = netlink.NewHandleAt(r.h); err != nil {
		t.Fatalf("netlink handle in %s: %v", name, err)
	}
	if n.Host, err = host.Open(r.h); err != nil {
		t.Fatalf("host handle in %s: %v", name, err)
	}
	lo, err := n.NL.LinkByName("lo")
	if err != nil {
		t.Fatalf("lo in %s: %v", name, err)
	}
	if err := n.NL.LinkSetUp(lo); err != nil {
		t.Fatalf("lo up in %s: %v", name, err)
	}
	return n
}

// Exec runs an observing command (ip, nft, ping, tcpdump) inside the
// namespace and returns its combined output; a failure fails the test.
func (n *NetNS) Exec(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.TryExec(args...)
	if err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(args, " "), n.Name, err, out)
	}
	return out
}

// TryExec is Exec that returns the error instead of failing the test.
func (n *NetNS) TryExec(args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name}, args...)...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}

// Veth creates a veth pair with one end (name) in n and the other (peer) in
// other, both up, and returns them.
func (n *NetNS) Veth(t testing.TB, name string, other *NetNS, peer string) {
	t.Helper()
	la := netlink.NewLinkAttrs()
	la.Name = name
	v := &netlink.Veth{LinkAttrs: la, PeerName: peer, PeerNamespace: netlink.NsFd(other.Handle)}
	if err := n.NL.LinkAdd(v); err != nil {
		t.Fatalf("veth %s/%s: %v", name, peer, err)
	}
	for _, x := range []struct {
		ns   *NetNS
		name string
	}{{n, name}, {other, peer}} {
		l, err := x.ns.NL.LinkByName(x.name)
		if err != nil {
			t.Fatalf("veth %s: %v", x.name, err)
		}
		if err := x.ns.NL.LinkSetUp(l); err != nil {
			t.Fatalf("veth %s up: %v", x.name, err)
		}
	}
}
