package agent

import (
	"encoding/binary"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func linkMsg(index int32, name string) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	return append(b, nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)).Serialize()...)
}

func addrMsg(index int32) []byte {
	b := make([]byte, unix.SizeofIfAddrmsg)
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	return b
}

// TestLinkNameCache: the index-to-name cache that matches address events
// to named links follows the links: a deleted link leaves it, so pods
// coming and going do not grow it without end, and a new link that gets
// the old index is not taken for the old one.
func TestLinkNameCache(t *testing.T) {
	want := &interest{names: map[string]bool{"shim0": true}}
	names := map[int32]string{}
	if !relevant(unix.RTM_NEWLINK, linkMsg(7, "shim0"), want, names) {
		t.Error("a named link's event is not relevant")
	}
	if !relevant(unix.RTM_NEWADDR, addrMsg(7), want, names) {
		t.Error("an address event on the named link is not relevant")
	}
	for i := int32(100); i < 1100; i++ {
		relevant(unix.RTM_NEWLINK, linkMsg(i, "veth"), want, names)
		relevant(unix.RTM_DELLINK, linkMsg(i, "veth"), want, names)
	}
	relevant(unix.RTM_DELLINK, linkMsg(7, "shim0"), want, names)
	if len(names) != 0 {
		t.Errorf("%d names cached after every link was deleted", len(names))
	}
	if relevant(unix.RTM_NEWADDR, addrMsg(7), want, names) {
		t.Error("an address on a reused index is taken for the deleted named link")
	}
}

// TestPollInterval: the WireGuard poll keeps its interval while reading
// digests is cheap, and stretches so that it takes at most 1/500 of a
// core, never past 30 s (the default resync).
func TestPollInterval(t *testing.T) {
	for _, c := range []struct{ base, cost, want time.Duration }{
		{500 * time.Millisecond, 50 * time.Microsecond, 500 * time.Millisecond},
		{500 * time.Millisecond, 1 * time.Millisecond, 500 * time.Millisecond},
		{500 * time.Millisecond, 4 * time.Millisecond, 2 * time.Second},
		{500 * time.Millisecond, 15 * time.Millisecond, 7500 * time.Millisecond},
		{500 * time.Millisecond, 35 * time.Millisecond, 17500 * time.Millisecond},
		{500 * time.Millisecond, 300 * time.Millisecond, 30 * time.Second},
		{time.Minute, 300 * time.Millisecond, time.Minute},
	} {
		if got := pollInterval(c.base, c.cost); got != c.want {
			t.Errorf("pollInterval(%v, %v) = %v; want %v", c.base, c.cost, got, c.want)
		}
	}
}

// TestPollCosts: the interval follows the cheapest of the last four
// digest-only polls, so one slow poll among cheap ones does not stretch
// it, while a device whose digest became dear is priced within four.
func TestPollCosts(t *testing.T) {
	const base = 500 * time.Millisecond
	var c pollCosts
	ms := time.Millisecond
	for i, step := range []struct{ cost, want time.Duration }{
		{100 * time.Microsecond, base},
		{10 * ms, base}, // one stall: still the cheap poll's price
		{100 * time.Microsecond, base},
		{50 * ms, base},
		{50 * ms, base},
		{50 * ms, base}, // the cheap poll is still among the last four
		{50 * ms, 25 * time.Second},
		{2 * ms, time.Second}, // cheaper again: at once
	} {
		if got := pollInterval(base, c.add(step.cost)); got != step.want {
			t.Errorf("poll %d (cost %v): interval %v; want %v", i, step.cost, got, step.want)
		}
	}
}

// TestThreadCPU: the poll's clock counts this thread's work, not its
// waits.
func TestThreadCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	time.Sleep(50 * time.Millisecond)
	slept := threadCPU() - t0
	t1 := threadCPU()
	deadline := time.Now().Add(10 * time.Second)
	for threadCPU()-t1 < 20*time.Millisecond && time.Now().Before(deadline) {
	}
	spun := threadCPU() - t1
	if t0 <= 0 || slept > 10*time.Millisecond || spun < 20*time.Millisecond {
		t.Errorf("thread CPU %v at start; %v over a 50 ms sleep; %v over up to 10 s of work", t0, slept, spun)
	}
}

// TestMergePeers: register file changes alone stay a "peers" sync; with
// any other trigger the burst is a sync that re-reads the config (the
// other one's, when it re-reads; the start's, which re-reads when files
// changed since the load).
func TestMergePeers(t *testing.T) {
	for _, c := range []struct{ have, why, want trigger }{
		{trigNone, trigPeers, trigPeers},
		{trigPeers, trigPeers, trigPeers},
		{trigPeers, trigEvent, trigConfig},
		{trigEvent, trigPeers, trigConfig},
		{trigPeers, trigRetry, trigConfig},
		{trigPeers, trigResync, trigResync},
		{trigPeers, trigConfig, trigConfig},
		{trigSignal, trigPeers, trigSignal},
		{trigStart, trigPeers, trigStart},
		{trigPeers, trigProvider, trigConfig},
	} {
		if got := merge(c.have, c.why); got != c.want {
			t.Errorf("merge(%s, %s) = %s; want %s", c.have, c.why, got, c.want)
		}
	}
}

// TestMergeOperatorReload: an operator's reload (SIGHUP, the API's) and a
// save in one debounced burst are a reload, in either order, so the
// save-guard reads the save as the operator asked; a save with anything
// else is still a save.
func TestMergeOperatorReload(t *testing.T) {
	for _, c := range []struct{ have, why, want trigger }{
		{trigConfig, trigSignal, trigSignal},
		{trigSignal, trigConfig, trigSignal},
		{trigConfig, trigAPI, trigAPI},
		{trigAPI, trigConfig, trigAPI},
		{trigResync, trigSignal, trigSignal},
		{trigConfig, trigResync, trigConfig},
		{trigEvent, trigConfig, trigConfig},
		{trigConfig, trigStart, trigConfig},
	} {
		if got := merge(c.have, c.why); got != c.want {
			t.Errorf("merge(%s, %s) = %s; want %s", c.have, c.why, got, c.want)
		}
	}
}

// TestKicksKeepEveryTrigger: a storm of kernel events that outruns the
// loop does not push out a register file's change (it used to be dropped
// with the 17th kick, and waited for the next resync): every kind of
// trigger given is taken once, and the loop is woken once.
func TestKicksKeepEveryTrigger(t *testing.T) {
	d := &Daemon{kick: make(chan struct{}, 1)}
	for range 100 {
		d.kickNow(trigEvent)
	}
	d.kickNow(trigPeers)
	d.kickNow(trigEvent)
	if len(d.kick) != 1 {
		t.Fatalf("%d wake-ups queued; want 1", len(d.kick))
	}
	<-d.kick
	if got, want := d.kicks(), []trigger{trigEvent, trigPeers}; !slices.Equal(got, want) {
		t.Errorf("kicks() = %v; want %v", got, want)
	}
	if got := d.kicks(); len(got) != 0 {
		t.Errorf("kicks() again = %v; want none", got)
	}
}
