package neighbours

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/nmbus/nmbustest"
)

func TestNMWatchNil(t *testing.T) {
	var w *nmWatch
	if hs := w.hazards([]string{"wg0"}); hs != nil {
		t.Errorf("nil watch: %v", hs)
	}
}

// nmLog is a log sink the watch's goroutine and the test share.
type nmLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *nmLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *nmLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *nmLog) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

// The watch against a stand-in NetworkManager on a private bus: it asks it
// to leave nodeagent's links alone, and reports a link only when it took
// it back or refused; again after a restart; nothing once it stops.
func TestNMWatch(t *testing.T) {
	addr := nmbustest.StartBus(t)
	defer func(a string, r, s time.Duration) { nmBusAddress, nmRetry, nmSettle = a, r, s }(nmBusAddress, nmRetry, nmSettle)
	nmBusAddress, nmRetry, nmSettle = addr, 500*time.Millisecond, 20*time.Millisecond

	var logs nmLog
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan struct{}, 1)
	w := startNetworkManager(ctx, log, func() {
		select {
		case changes <- struct{}{}:
		default:
		}
	})
	defer func() {
		cancel()
		<-w.done
	}()
	links := []string{"trunk1.50", "shim0", "wg0"}
	until := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not in 10 s; hazards %v\nlog:\n%s", what, w.hazards(links), logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	hazardsNamed := func(want ...string) func() bool {
		return func() bool {
			hs := w.hazards(links)
			if len(hs) != len(want) {
				return false
			}
			for i, hz := range hs {
				if !strings.Contains(hz.What, want[i]) {
					return false
				}
			}
			return true
		}
	}
	if hs := w.hazards(links); len(hs) != 0 {
		t.Fatalf("no NetworkManager: %v", hs)
	}

	nm := nmbustest.NewNM(t, addr)
	nm.AddDevice("trunk1.50", "trunk1.50", true)
	nm.AddDevice("wg0", "wg0", true)
	nm.AddDevice("up0", "uplink", false)
	until("trunk1.50 and wg0 unmanaged", func() bool { return !nm.Managed("trunk1.50") && !nm.Managed("wg0") })
	if !nm.Managed("up0") {
		t.Error("the watch unmanaged up0, not nodeagent's")
	}
	until("one INFO line per link", func() bool {
		return logs.count(`level=INFO msg="asked NetworkManager to leave nodeagent's link unmanaged" link=trunk1.50 held="as its connection \"trunk1.50\" (external)"`) == 1 &&
			logs.count(`level=INFO msg="asked NetworkManager to leave nodeagent's link unmanaged" link=wg0`) == 1
	})
	if hs := w.hazards(links); len(hs) != 0 {
		t.Errorf("after NetworkManager let go: %v", hs)
	}

	// It takes trunk1.50 back (an operator's nmcli device set ... managed
	// yes): reported, not fought over.
	drainChanges(changes)
	nm.SetManaged("trunk1.50", true)
	until("trunk1.50 reported", hazardsNamed("holds nodeagent's link trunk1.50 as its connection \"trunk1.50\" (external) again after it was asked"))
	select {
	case <-changes:
	case <-time.After(5 * time.Second):
		t.Error("changed was not called")
	}
	hz := w.hazards(links)[0]
	want := hazard.Hazard{Source: "NetworkManager", Manager: "NetworkManager", Link: "trunk1.50",
		What: `holds nodeagent's link trunk1.50 as its connection "trunk1.50" (external) again after it was asked to leave it unmanaged; a reapply replaces nodeagent's addresses`,
		Fix:  "unmanaged-devices=interface-name:trunk1.50 under [keyfile] in /etc/NetworkManager/conf.d/nodeagent.conf (example in /usr/share/doc/nodeagent/examples/NetworkManager/conf.d/), then systemctl reload NetworkManager",
	}
	if hz.Source != want.Source || hz.What != want.What || hz.Fix != want.Fix || strings.Join(hz.Kinds, ",") != "address,route" {
		t.Errorf("hazard\n got %+v\nwant %+v", hz, want)
	}
	sets := nm.Sets()
	time.Sleep(3 * nmRetry)
	if nm.Sets() != sets {
		t.Errorf("the watch asked again for a link NetworkManager took back")
	}

	// A restart: a new NetworkManager that manages both again is asked
	// again, and logged again.
	nm.Restart()
	until("unmanaged after a restart", func() bool { return !nm.Managed("trunk1.50") && !nm.Managed("wg0") })
	until("no hazard after a restart", hazardsNamed())
	until("INFO again after a restart", func() bool {
		return logs.count(`level=INFO msg="asked NetworkManager to leave nodeagent's link unmanaged" link=trunk1.50`) == 2
	})

	// A NetworkManager that keeps them unmanaged across a restart is not
	// asked.
	nm.KeepUnmanaged = true
	sets = nm.Sets()
	nm.Restart()
	time.Sleep(3 * nmRetry)
	if nm.Sets() != sets || nm.Managed("trunk1.50") {
		t.Errorf("after a restart that kept them unmanaged: %d sets, managed %v", nm.Sets()-sets, nm.Managed("trunk1.50"))
	}
	// ... and its taking one back under that instance is reported, not
	// fought over.
	nm.SetManaged("trunk1.50", true)
	until("a takeback after a restart reported", hazardsNamed(`holds nodeagent's link trunk1.50 as its connection "trunk1.50" (external) again after`))
	time.Sleep(3 * nmRetry)
	if nm.Sets() != sets || !nm.Managed("trunk1.50") {
		t.Errorf("the watch fought a takeback after a restart: %d sets", nm.Sets()-sets)
	}
	nm.SetManaged("trunk1.50", false)
	until("no hazard once it lets go", hazardsNamed())

	// A refusal is reported with NetworkManager's answer, short.
	nm.KeepUnmanaged = false
	nm.Refuse("org.freedesktop.NetworkManager.PermissionDenied", "Not authorized to control networking."+strings.Repeat(" x", 10000))
	nm.Restart()
	until("refusals reported", hazardsNamed(
		"holds nodeagent's link trunk1.50 as its connection \"trunk1.50\" (external) and did not leave it unmanaged when asked (set Managed=false: org.freedesktop.NetworkManager.PermissionDenied: Not authorized",
		"holds nodeagent's link wg0"))
	for _, hz := range w.hazards(links) {
		if len(hz.What) > 400 {
			t.Errorf("a hazard of %d bytes: %.100s...", len(hz.What), hz.What)
		}
	}
	// A refusal is asked again, after nmRetry.
	nm.Refuse("", "")
	until("unmanaged once it stops refusing", func() bool { return !nm.Managed("trunk1.50") && !nm.Managed("wg0") })
	until("no hazard once it stops refusing", hazardsNamed())

	// hazards never waits for the bus: NetworkManager hangs.
	nm.SetManaged("wg0", true)
	until("wg0 taken back", hazardsNamed("wg0"))
	nm.Hang(5 * time.Second)
	start := time.Now()
	for range 50 {
		w.hazards(links)
		w.hazards(links[:1])
	}
	if el := time.Since(start); el > 100*time.Millisecond {
		t.Errorf("100 hazards calls against a hung NetworkManager took %v", el)
	}
	nm.Hang(0)

	// It stops: nothing is reported.
	nm.Stop()
	until("nothing once it stops", hazardsNamed())
}

func drainChanges(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// Without a bus the watch reports nothing, retries quietly, and stops
// with its context.
func TestNMWatchNoBus(t *testing.T) {
	defer func(a string, r time.Duration) { nmBusAddress, nmRetry = a, r }(nmBusAddress, nmRetry)
	nmBusAddress, nmRetry = "unix:path="+t.TempDir()+"/none", 50*time.Millisecond
	var logs nmLog
	ctx, cancel := context.WithCancel(context.Background())
	w := startNetworkManager(ctx, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), func() {})
	links := []string{"wg0"}
	if hs := w.hazards(links); hs != nil {
		t.Errorf("no bus: %v", hs)
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not stop with its context")
	}
	if n := logs.count("level=DEBUG msg=\"NetworkManager's bus\""); n < 2 {
		t.Errorf("%d retries logged at DEBUG in 300ms, want several", n)
	}
	if n := logs.count("level=INFO") + logs.count("level=WARN"); n != 0 {
		t.Errorf("a missing bus logged above DEBUG:\n%s", logs.String())
	}
}
