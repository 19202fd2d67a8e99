package wg_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// stagingLab writes a register of n peer files (one with a preshared key
// file, an endpoint and a keepalive; one that clashes with an earlier
// file) and a config with a static peer, MTU, port, fwmark and address.
func stagingLab(t *testing.T, n int) *config.Config {
	t.Helper()
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "wg0.key")
	key, _ := wgtypes.GeneratePrivateKey()
	os.WriteFile(keyPath, []byte(key.String()+"\n"), 0o600)
	pskPath := filepath.Join(dir, "bob.psk")
	psk, _ := wgtypes.GenerateKey()
	os.WriteFile(pskPath, []byte(psk.String()+"\n"), 0o600)
	reg := filepath.Join(dir, "peers.d")
	testenv.WriteRegister(t, reg, n)
	bob, _ := wgtypes.GenerateKey()
	os.WriteFile(filepath.Join(reg, "bob.yaml"), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.99.0.2/32, fd00:99::2/128]\nendpoint: 192.0.2.9:51999\npersistentKeepalive: 25\npresharedKeyFile: %s\n", bob, pskPath)), 0o644)
	clash, _ := wgtypes.GenerateKey()
	os.WriteFile(filepath.Join(reg, "zz-clash.yaml"), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.99.0.2/32]\n", clash)), 0o644)
	gw, _ := wgtypes.GenerateKey()
	yaml := fmt.Sprintf(`wireguard:
  - name: wg0
    implementation: kernel
    privateKeyFile: %s
    listenPort: 51820
    fwMark: 0x51
    mtu: 1380
    addresses: [10.99.255.1/24]
    peersDir: %s
    peers:
      - name: gw
        publicKey: %s
        allowedIPs: [10.98.0.0/16]
`, keyPath, reg, gw)
	cfgFile := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfgFile, []byte(yaml), 0o644)
	c, err := config.Load(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// stages lists the namespace's staging devices.
func stages(t *testing.T, h *host.Host) []host.Link {
	t.Helper()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []host.Link
	for _, l := range links {
		if strings.HasPrefix(l.Name, "nastg") {
			out = append(out, l)
		}
	}
	return out
}

// TestStagedCreation: at start-up a new kernel device's register peers are
// written, as they are read, to a staging device; the sync that creates
// the device takes it (renamed, marked, addressed, up), writes no peer
// itself, and reaches exactly the state an unstaged creation reaches, with
// the same report. A desired state that no longer matches what was staged
// has its stage deleted and is created as always; a stage no sync takes
// is deleted by Finish; one a dead process left is deleted by NewStager,
// and no other link is.
func TestStagedCreation(t *testing.T) {
	testenv.RequireModule(t, "wireguard")
	ctx := context.Background()
	const n = 300
	c := stagingLab(t, n)

	ns := testenv.NewNetNS(t)
	st := wg.NewStager(ns.Host, nil)
	des, err := netcfg.FromConfigStaged(c, "", &register.Cache{}, st)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := netcfg.FromConfig(c, "")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(plain.WG, des.WG, cmpopts.IgnoreFields(wg.Device{}, "Stage"), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Fatalf("staged desired state differs from the plain one (-plain +staged):\n%s", diff)
	}
	dev := des.WG.Devices[0]
	if dev.Stage == nil || len(dev.Peers) != n+2 || len(dev.Skipped) != 1 {
		t.Fatalf("stage %v, %d peers, skipped %v; want a stage, %d peers and the clash skipped", dev.Stage != nil, len(dev.Peers), dev.Skipped, n+2)
	}
	sl := stages(t, ns.Host)
	if len(sl) != 1 || sl[0].Group != host.StagingGroup || sl[0].Up || sl[0].Alias != "" || sl[0].MTU != 1380 {
		t.Fatalf("staging links: %+v; want one, down, unmarked, in the staging group, MTU 1380", sl)
	}
	if out := ns.Exec(t, "wg", "show", sl[0].Name, "peers"); strings.Count(out, "\n") != n+2 {
		t.Fatalf("the staging device holds %d peers before the sync, want %d", strings.Count(out, "\n"), n+2)
	}
	if _, err := ns.NL.LinkByName("wg0"); err == nil {
		t.Fatal("wg0 exists before the sync")
	}
	if sent, bound := wg.StageMessages(dev.Stage); sent > int64(bound) || sent == 0 {
		t.Errorf("the staging device's writer sent %d messages; want 1 to %d (ceil(bytes/page)+1)", sent, bound)
	} else {
		t.Logf("the staging device's writer sent %d messages (bound %d)", sent, bound)
	}
	cv := &netcfg.Converger{Host: ns.Host}
	defer cv.Close()
	p, err := cv.Plan(ctx, des)
	if err != nil {
		t.Fatal(err)
	}
	res := cv.Apply(ctx, p)
	st.Finish()
	for _, e := range res.Report {
		if e.Failed() && !e.Skipped() {
			t.Errorf("failed: %v", e.Err)
		}
	}
	if got := cv.WG().PeerWrites(); got != 0 {
		t.Errorf("the sync wrote %d peers itself; the stage should have held them all", got)
	}
	if res.Post.WG.Writes() {
		t.Errorf("after the sync, still to do:\n%s", res.Post.WG)
	}
	if len(stages(t, ns.Host)) != 0 {
		t.Error("a staging device is left after the sync")
	}
	l, err := ns.Host.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(l, func(l host.Link) bool { return l.Name == "wg0" })
	if i < 0 || l[i].Alias != host.LinkAlias || l[i].Group != 0 || !l[i].Up || l[i].MTU != 1380 {
		t.Fatalf("wg0 after the sync: %+v; want it marked, group 0, up, MTU 1380", l)
	}
	if out := ns.Exec(t, "ip", "-o", "addr", "show", "dev", "wg0"); !strings.Contains(out, "10.99.255.1/24") {
		t.Errorf("wg0 has not its address:\n%s", out)
	}
	staged := ns.Exec(t, "wg", "show", "wg0", "dump")

	// The same config created without a stage: the same report and the
	// same device.
	ns2 := testenv.NewNetNS(t)
	cv2 := &netcfg.Converger{Host: ns2.Host}
	defer cv2.Close()
	p2, _ := cv2.Plan(ctx, plain)
	res2 := cv2.Apply(ctx, p2)
	if a, b := res.Report.String(), res2.Report.String(); a != b {
		t.Errorf("reports differ (staged, then plain):\n%s\n---\n%s", a, b)
	}
	if a, b := dumpLines(staged), dumpLines(ns2.Exec(t, "wg", "show", "wg0", "dump")); !slices.Equal(a, b) {
		t.Errorf("the staged device differs from the plainly created one:\n%s", cmp.Diff(b, a))
	}

	// What was staged no longer matches: one peer's allowed IPs changed
	// after the read. The stage is deleted; the device is created whole.
	ns3 := testenv.NewNetNS(t)
	st3 := wg.NewStager(ns3.Host, nil)
	des3, err := netcfg.FromConfigStaged(c, "", &register.Cache{}, st3)
	if err != nil {
		t.Fatal(err)
	}
	changed := &des3.WG.Devices[0].Peers[7]
	changed.AllowedIPs = []netip.Prefix{netip.MustParsePrefix("10.97.0.7/32")}
	cv3 := &netcfg.Converger{Host: ns3.Host}
	defer cv3.Close()
	if _, err := cv3.Sync(ctx, des3); err != nil {
		if _, _, failed := netcfg.Split(err); len(failed) > 0 {
			t.Fatal(err)
		}
	}
	st3.Finish()
	st3.Wait(0)
	if got := cv3.WG().PeerWrites(); got != n+2 {
		t.Errorf("a mismatched stage: the sync wrote %d peers, want all %d", got, n+2)
	}
	if len(stages(t, ns3.Host)) != 0 {
		t.Error("a mismatched staging device is left")
	}
	if out := ns3.Exec(t, "wg", "show", "wg0", "allowed-ips"); !strings.Contains(out, changed.PublicKey.String()+"\t"+changed.AllowedIPs[0].String()) {
		t.Errorf("the changed peer is not as desired:\n%s", out)
	}

	// A stage no sync takes: Finish deletes it. Then NewStager deletes a
	// staging device a dead process left, and not a link that only looks
	// like one.
	ns4 := testenv.NewNetNS(t)
	st4 := wg.NewStager(ns4.Host, nil)
	if _, err := netcfg.FromConfigStaged(c, "", &register.Cache{}, st4); err != nil {
		t.Fatal(err)
	}
	if len(stages(t, ns4.Host)) != 1 {
		t.Fatal("no staging device")
	}
	// The deletion runs in the background: held up, Finish returns all
	// the same (a kernel takes seconds to delete thousands of peers, which
	// the daemon's loop must not wait for), and Wait waits for it.
	release, deleting := make(chan struct{}), make(chan int, 1)
	wg.SetDelLink(st4, func(index int) error {
		deleting <- index
		<-release
		return ns4.NL.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index}})
	})
	st4.Finish()
	if idx := <-deleting; len(stages(t, ns4.Host)) != 1 || idx != stages(t, ns4.Host)[0].Index {
		t.Fatal("the stage is not the one being deleted")
	}
	if st4.Wait(10 * time.Millisecond) {
		t.Error("Wait reported a held deletion done")
	}
	close(release)
	if !st4.Wait(0) || len(stages(t, ns4.Host)) != 0 {
		t.Error("Finish left an untaken staging device")
	}
	if _, err := ns4.Host.LinkCreate(host.LinkSpec{Name: "nastg0badf00d", Kind: "wireguard", Group: host.StagingGroup}); err != nil {
		t.Fatal(err)
	}
	if _, err := ns4.Host.LinkCreate(host.LinkSpec{Name: "nastgnotmine", Kind: "wireguard"}); err != nil {
		t.Fatal(err)
	}
	wg.NewStager(ns4.Host, nil).Wait(0)
	if sl := stages(t, ns4.Host); len(sl) != 1 || sl[0].Name != "nastgnotmine" {
		t.Errorf("after NewStager: %+v; want only nastgnotmine", sl)
	}
}

// dumpLines is `wg show dump`, sorted.
func dumpLines(s string) []string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	slices.Sort(lines)
	return lines
}
