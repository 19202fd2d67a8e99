package netcfg

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestHeldPeers: a disabled register peer and one whose expiry passed are
// kept out of the device and listed as held; a peer expiring during the
// run is planned out once its time comes, by a desired state read before
// it (a quiet resync keeps that), and stays out when the register is
// read again; a file changed to disabled is taken out peer by peer
// (ApplyPeerFiles), and back in once enabled.
func TestHeldPeers(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir := t.TempDir()
	key, _ := wgtypes.GeneratePrivateKey()
	keyFile := filepath.Join(dir, "wg0.key")
	os.WriteFile(keyFile, []byte(key.String()+"\n"), 0o600)
	peers := filepath.Join(dir, "peers.d")
	os.Mkdir(peers, 0o755)
	pub := map[string]string{}
	write := func(name, extra string, ip int) {
		if pub[name] == "" {
			k, _ := wgtypes.GeneratePrivateKey()
			pub[name] = k.PublicKey().String()
		}
		os.WriteFile(filepath.Join(peers, name+".yaml"), fmt.Appendf(nil, "publicKey: %s\nallowedIPs: [10.90.0.%d/32]\n%s", pub[name], ip, extra), 0o644)
	}
	soon := time.Now().Add(1500 * time.Millisecond).UTC().Truncate(time.Second).Add(time.Second)
	write("active", "", 2)
	write("off", "disabled: true\n", 3)
	write("gone", "expires: 2020-01-01T00:00:00Z\n", 4)
	write("soon", "expires: "+soon.Format(time.RFC3339)+"\n", 5)
	dev := "wg0" + strings.TrimPrefix(ns.Name, "na-test-")[:4]
	yaml := fmt.Sprintf("wireguard:\n  - {name: %s, privateKeyFile: %s, addresses: [10.90.0.1/24], peersDir: %s}\n", dev, keyFile, peers)
	c, err := config.Parse(filepath.Join(dir, "nodeagent.yaml"), []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cache := &register.Cache{}
	d, err := FromConfigCached(c, tablesFile(t, ns), cache)
	if err != nil {
		t.Fatal(err)
	}
	us := wg.NewUserspace(nil)
	t.Cleanup(us.Close)
	cv := &Converger{Host: ns.Host, Userspace: us}
	defer cv.Close()
	ctx := context.Background()
	kernel := func() []string {
		out := ns.Exec(t, "wg", "show", dev, "allowed-ips")
		var ips []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) == 2 {
				ips = append(ips, f[1])
			}
		}
		slices.Sort(ips)
		return ips
	}
	held := func(d Desired) []string {
		var out []string
		for _, h := range d.At(time.Now()).WG.Devices[0].Held {
			out = append(out, h.Name+"="+h.State)
		}
		slices.Sort(out)
		return out
	}
	if _, err := cv.Sync(ctx, d); err != nil {
		t.Fatal(err)
	}
	if got := kernel(); !slices.Equal(got, []string{"10.90.0.2/32", "10.90.0.5/32"}) {
		t.Errorf("in the device: %v, want active and soon", got)
	}
	if got := held(d); !slices.Equal(got, []string{"gone=expired", "off=disabled"}) {
		t.Errorf("held: %v", got)
	}
	if next := NextExpiry(d, time.Now()); !next.Equal(soon) {
		t.Errorf("next expiry %v, want %v", next, soon)
	}
	time.Sleep(time.Until(soon) + 50*time.Millisecond)
	// The same desired state, read before the expiry.
	p, err := cv.Plan(ctx, d)
	if err != nil || !strings.Contains(p.String(), "- wireguard "+dev+" peer") || strings.Count(p.String(), "\n") != 1 {
		t.Errorf("plan after the expiry (err %v):\n%s", err, p)
	}
	if _, err := cv.Sync(ctx, d); err != nil {
		t.Fatal(err)
	}
	if got := kernel(); !slices.Equal(got, []string{"10.90.0.2/32"}) {
		t.Errorf("after the expiry: %v", got)
	}
	// Read again (a full resync, a restart): held from the start.
	d, _ = FromConfigCached(c, tablesFile(t, ns), cache)
	if got := held(d); !slices.Equal(got, []string{"gone=expired", "off=disabled", "soon=expired"}) {
		t.Errorf("held after a fresh read: %v", got)
	}
	if p, _ := cv.Plan(ctx, d); !p.Empty() {
		t.Errorf("a fresh read puts an expired peer back:\n%s", p)
	}
	// Disabled in its file, then enabled: one peer each time.
	write("active", "disabled: true\n", 2)
	nd, ops, _, err := cv.ApplyPeerFiles(ctx, c, d, []string{filepath.Join(peers, "active.yaml")}, cache)
	if err != nil || len(ops) != 1 || ops[0].Kind != wg.OpRemovePeer || len(kernel()) != 0 {
		t.Fatalf("disable: err %v, ops %v, device %v", err, ops, kernel())
	}
	if got := held(nd); !slices.Contains(got, "active=disabled") {
		t.Errorf("held after disable: %v", got)
	}
	write("active", "", 2)
	nd, ops, _, err = cv.ApplyPeerFiles(ctx, c, nd, []string{filepath.Join(peers, "active.yaml")}, cache)
	if err != nil || len(ops) != 1 || ops[0].Kind != wg.OpAddPeer || !slices.Equal(kernel(), []string{"10.90.0.2/32"}) {
		t.Fatalf("enable: err %v, ops %v, device %v", err, ops, kernel())
	}
	if got := held(nd); slices.Contains(got, "active=disabled") {
		t.Errorf("still held after enable: %v", got)
	}
}
