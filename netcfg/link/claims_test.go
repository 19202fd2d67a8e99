package link

import (
	"net/netip"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/arp"
)

// The memory stays within claimsMax, keeps conflicts over plain sightings,
// and forgets a sighting past the window.
func TestClaimsMemory(t *testing.T) {
	c := &claims{m: map[claimKey]claim{}}
	now := time.Now()
	ip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
	c.sawConflict("shim0", ip(0), now)
	c.mu.Lock()
	for i := 1; i <= claimsMax+100; i++ {
		c.sawOurs("shim0", ip(i), now.Add(time.Duration(i)*time.Millisecond))
	}
	c.mu.Unlock()
	if len(c.m) > claimsMax {
		t.Fatalf("memory holds %d addresses, bound %d", len(c.m), claimsMax)
	}
	if e, ok := c.m[claimKey{"shim0", ip(0)}]; !ok || !e.conflict {
		t.Error("the conflict was evicted before plain sightings")
	}
	if c.recent("shim0", ip(0), now) {
		t.Error("an address once in conflict counts as a quick re-add")
	}
	last := ip(claimsMax + 100)
	if !c.recent("shim0", last, now.Add(time.Minute)) {
		t.Error("an address seen a minute ago is not recent")
	}
	if c.recent("shim0", last, now.Add(recentWindow+time.Minute)) {
		t.Error("an address seen past the window is still recent")
	}
	if c.recent("shim1", last, now) {
		t.Error("an address seen on another link is recent on this one")
	}
	if q := quick(arp.Config{Probes: 3, Interval: time.Second, Wait: 2 * time.Second, Announcements: 2}); q.Probes != 1 || q.Wait != quickWait || q.Announcements != 2 {
		t.Errorf("quick check %+v", q)
	}
}
