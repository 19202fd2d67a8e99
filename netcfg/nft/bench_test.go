package nft_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/testenv"
)

// benchDesired has n masquerade sources out tun0 and n kill-switch sources
// allowed out tun0 only: /24s two apart, so no two merge into one range.
func benchDesired(n int) nft.Desired {
	var d nft.Desired
	for i := 0; i < n; i++ {
		d.Masquerade = append(d.Masquerade, nft.Masquerade{
			From: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(2 * i / 256), byte(2 * i % 256), 0}), 24), Out: "tun0"})
		d.KillSwitch = append(d.KillSwitch, nft.KillSwitch{
			From: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + 2*i/256), byte(2 * i % 256), 0}), 24), AllowOut: []string{"tun0"}})
	}
	return d
}

// benchScript is the same ruleset as benchDesired, written for nft -f.
func benchScript(d nft.Desired) string {
	var masq, ks []string
	for _, m := range d.Masquerade {
		masq = append(masq, m.From.String())
	}
	for _, k := range d.KillSwitch {
		ks = append(ks, k.From.String())
	}
	return fmt.Sprintf(`table inet nodeagent {
	counter ks_drops {
	}
	set ks_tun0_out {
		type ifname
		elements = { "tun0" }
	}
	set ks_tun0_v4 {
		type ipv4_addr
		flags interval
		elements = { %s }
	}
	set masq_tun0_v4 {
		type ipv4_addr
		flags interval
		elements = { %s }
	}
	chain forward {
		type filter hook forward priority -10; policy accept;
		ip saddr @ks_tun0_v4 oifname != @ks_tun0_out counter name "ks_drops" drop comment "nodeagent kill switch"
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr @masq_tun0_v4 oifname "tun0" masquerade
	}
}
`, strings.Join(ks, ", "), strings.Join(masq, ", "))
}

// BenchmarkNftRuleset puts nodeagent's cold apply of 1000 masquerade and
// 1000 kill-switch sources (observe, plan, one transaction, observe again)
// beside `nft -f` of the same ruleset, best of 3 each, checks that the two
// rulesets are the same, and times the no-op sync of the result (best of
// 5) with its writes and nftables notifications. Run with -benchtime=1x.
func BenchmarkNftRuleset(b *testing.B) {
	const n, runs = 1000, 3
	d := benchDesired(n)
	script := filepath.Join(b.TempDir(), "ruleset.nft")
	if err := os.WriteFile(script, []byte(benchScript(d)), 0o644); err != nil {
		b.Fatal(err)
	}
	best := func(cur, d time.Duration) time.Duration {
		if cur == 0 || d < cur {
			return d
		}
		return cur
	}
	for i := 0; i < b.N; i++ {
		ns := testenv.NewNetNS(b)
		var cold, applyOnly, nftF, noop time.Duration
		for r := 0; r < runs; r++ {
			start := time.Now()
			o, err := nft.Observe(context.Background(), ns.Host.Snapshot(), d)
			if err != nil {
				b.Fatal(err)
			}
			p := nft.MakePlan(d, o)
			a := time.Now()
			if _, rep := nft.Apply(context.Background(), ns.Host.Snapshot(), p); rep.Err() != nil {
				err := rep.Err()
				b.Fatal(err)
			}
			cold = best(cold, time.Since(start))
			applyOnly = best(applyOnly, time.Since(a))
			ns.Exec(b, "nft", "delete", "table", "inet", "nodeagent")

			start = time.Now()
			if out, err := exec.Command("ip", "netns", "exec", ns.Name, "nft", "-f", script).CombinedOutput(); err != nil {
				b.Fatalf("nft -f: %v\n%s", err, out)
			}
			nftF = best(nftF, time.Since(start))
			if r < runs-1 {
				ns.Exec(b, "nft", "delete", "table", "inet", "nodeagent")
			}
		}
		// What nft -f made is what nodeagent wants: the same ruleset.
		if p := nft.MakePlan(d, observe(b, ns)); !p.Empty() {
			b.Fatalf("nft -f and nodeagent differ:\n%s", p)
		}
		mon := newNftMonitor(b, ns)
		before := ns.Host.Writes()
		for r := 0; r < 5; r++ {
			start := time.Now()
			if p := converge(b, ns, d); !p.Empty() {
				b.Fatalf("no-op sync planned:\n%s", p)
			}
			noop = best(noop, time.Since(start))
		}
		writes, notes := ns.Host.Writes()-before, mon.Stop()

		ratio := cold.Seconds() / nftF.Seconds()
		b.ReportMetric(cold.Seconds()*1000, "nodeagent-ms")
		b.ReportMetric(nftF.Seconds()*1000, "nft-f-ms")
		b.ReportMetric(ratio, "x-nft-f")
		b.ReportMetric(noop.Seconds()*1000, "noop-ms")
		b.ReportMetric(float64(writes), "noop-writes")
		fmt.Printf("\n%d masquerade + %d kill-switch sources (2 sets, 2 rules), cold apply, best of %d:\n"+
			"  nodeagent (observe, plan, 1 transaction, observe)  %7.1f ms   %.2fx nft -f (target <= 1.5x)\n"+
			"    of which nft.Apply (transaction + observe)             %7.1f ms\n"+
			"  nft -f (ip netns exec nft -f FILE)                  %7.1f ms\n"+
			"no-op sync of the same: %.2f ms, %d writes, %d nftables notifications (target 0)\n\n",
			n, n, runs, cold.Seconds()*1000, ratio, applyOnly.Seconds()*1000, nftF.Seconds()*1000,
			noop.Seconds()*1000, writes, notes)
	}
}
