package wg_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestAdoptKeepsPeersTheRegisterLacks: a device taken over with adopt:
// true has a peer its register does not name (the old setup added it
// after the import read the node). The adoption keeps it and lists it;
// a restarted daemon (a new handle, the same state directory) keeps it
// too; once its file joins the register it is the register's, and
// removing the file then removes it. The device is another process's
// userspace device (read through its UAPI socket), unmarked, as the host
// kernel has no WireGuard; the VM tier runs the same on a kernel device.
func TestAdoptKeepsPeersTheRegisterLacks(t *testing.T) {
	for _, impl := range impls(t) {
		t.Run(impl, func(t *testing.T) {
			l := newLab(t)
			a := testenv.NewNetNS(t)
			ka, _ := l.key("a")
			var peers []wgtypes.Key
			for range 3 {
				k, err := wgtypes.GeneratePrivateKey()
				if err != nil {
					t.Fatal(err)
				}
				peers = append(peers, k.PublicKey())
			}
			name := devName("wgk")
			yaml := func(adopt bool, n int) string {
				s := fmt.Sprintf("wireguard:\n  - name: %s\n    implementation: %s\n    privateKeyFile: %s\n    listenPort: 51820\n    adopt: %v\n    peers:\n", name, impl, ka, adopt)
				for i, k := range peers[:n] {
					s += fmt.Sprintf("      - {name: p%d, publicKey: %q, allowedIPs: [10.99.0.%d/32]}\n", i, k, i+2)
				}
				return s
			}
			// The old setup's device, with all three peers.
			l.sync(l.handle(a), l.desired(yaml(false, 3)), false)
			a.Exec(t, "ip", "link", "set", name, "alias", "")
			a.Exec(t, "ip", "link", "set", name, "group", "default")

			state := t.TempDir()
			handle := func() *wg.Handle {
				us := l.us
				if impl == wg.ImplUserspace {
					us = nil // another process's device: read through its socket
				}
				h := &wg.Handle{Host: a.Host, Userspace: us, Log: l.log, StateDir: state}
				t.Cleanup(h.Close)
				return h
			}
			inKernel := func() int { return strings.Count(a.Exec(t, "wg", "show", name, "peers"), "\n") }

			p, _ := l.sync(handle(), l.desired(yaml(true, 2)), false)
			t.Logf("the adoption:\n%s", p)
			if !strings.Contains(p.String(), "peer "+peers[2].String()+" kept (in the kernel, not in the register") || !p.Report().OnlyAdoptions() {
				t.Errorf("the adoption does not keep and list the peer the register lacks, or is not only adoptions:\n%s", p)
			}
			if n := inKernel(); n != 3 {
				t.Errorf("after the adoption the device has %d peers, want 3", n)
			}
			rec, err := os.ReadFile(filepath.Join(state, "wireguard", "kept-peers.json"))
			if err != nil || !strings.Contains(string(rec), peers[2].String()) {
				t.Errorf("the kept peer is not recorded (%v): %s", err, rec)
			}
			if st, err := os.Stat(filepath.Join(state, "wireguard", "kept-peers.json")); err == nil && st.Mode().Perm() != 0o600 {
				t.Errorf("the record is %v, want 0600", st.Mode().Perm())
			}

			// A restart: a new handle reads the record.
			if p, _ := l.sync(handle(), l.desired(yaml(true, 2)), false); !p.Empty() {
				t.Errorf("after a restart the plan is not empty:\n%s", p)
			}
			if n := inKernel(); n != 3 {
				t.Errorf("after a restart the device has %d peers, want 3", n)
			}

			h := handle()
			p, _ = l.sync(h, l.desired(yaml(true, 3)), false)
			if want := "~ wireguard " + name + " peer " + peers[2].String() + " (p2) no longer kept apart: the register names it now\n"; p.String() != want {
				t.Errorf("the register naming the kept peer plans:\n%swant:\n%s", p, want)
			}
			p, _ = l.sync(h, l.desired(yaml(true, 2)), false)
			if want := "- wireguard " + name + " peer " + peers[2].String() + "\n"; p.String() != want {
				t.Errorf("removing its file plans:\n%swant:\n%s", p, want)
			}
			if n := inKernel(); n != 2 {
				t.Errorf("the device has %d peers once the register dropped the third, want 2", n)
			}
		})
	}
}
