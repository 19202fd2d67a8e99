package nft_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/nft"
)

// TestReplaceWholeUnderFlood: the fallback that replaces nodeagent's
// table whole when the kernel refuses its update (a hand-made chain that
// a hand-made verdict map jumps to makes every diff EBUSY) keeps the kill
// switch whole under a UDP flood with the tunnel's routing broken: each
// replacement is one transaction, and no datagram reaches the WAN.
func TestReplaceWholeUnderFlood(t *testing.T) {
	lan, node, wan, _ := gatewayLab(t)
	atWan := nftCounters(t, wan, "ip saddr 10.10.50.0/24", "ip6 saddr fd00:50::/64")
	d := parse(t, killSwitchConfig)
	converge(t, node, d)
	run(t, node, "ip route flush table 150", "ip -6 route flush table 150")
	base := sum(atWan())

	var wg sync.WaitGroup
	var flood4, flood6 int
	wg.Add(2)
	go func() { defer wg.Done(); flood4 = udpFlood(t, lan, "198.51.100.10:9", 2*time.Second) }()
	go func() { defer wg.Done(); flood6 = udpFlood(t, lan, "[2001:db8:2::10]:9", 2*time.Second) }()
	replaced := 0
	for start := time.Now(); time.Since(start) < 2*time.Second; {
		node.Exec(t, "nft", "add chain inet nodeagent x; add map inet nodeagent vm { type ipv4_addr : verdict; elements = { 1.2.3.4 : jump x } }")
		o, err := nft.Observe(context.Background(), node.Host.Snapshot(), d)
		if err != nil {
			t.Fatal(err)
		}
		_, rep := nft.Apply(context.Background(), node.Host.Snapshot(), nft.MakePlan(d, o))
		if err := rep.Err(); err != nil {
			t.Fatalf("apply: %v", err)
		}
		if len(nft.Replaced(rep)) != 1 {
			t.Fatalf("the refused update was not replaced:\n%s", rep)
		}
		replaced++
	}
	wg.Wait()
	leaked := sum(atWan()) - base
	t.Logf("%d whole-table replacements in 2s under a UDP flood of %d datagrams (v4+v6) with routing broken: %d leaked", replaced, flood4+flood6, leaked)
	if leaked != 0 {
		t.Fatalf("%d datagrams leaked across %d replacements of the table", leaked, replaced)
	}
	if out := node.Exec(t, "nft", "list", "table", "inet", "nodeagent"); strings.Contains(out, "map vm") {
		t.Fatalf("the hand-made map survived:\n%s", out)
	}
}
