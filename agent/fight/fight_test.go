package fight

import (
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/plan"
)

func entry(kind, obj string) plan.Entry {
	return plan.Entry{Subsystem: plan.Links, Kind: kind, Action: plan.Change, Object: obj, Text: "~ re-own " + obj + " (noprefixroute, valid_lft 300sec, not ours)"}
}

// A program that changes an address back every second for two minutes:
// nodeagent repairs it at once Bound times, then once per resync (every
// 30 s); the fight is over a window after the last repair held.
func TestBackOffAndLetGo(t *testing.T) {
	tr := Tracker{Bound: 5, Window: time.Minute}
	addr := entry(plan.KindAddress, "address 10.10.50.1/24 on enp7s0.50")
	t0 := time.Unix(1000, 0)
	tr.Tick(t0)
	repairs, held := 0, 0
	var backedOff []Fight
	for s := 0; s < 120; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		if s > 0 && s%30 == 0 {
			tr.Tick(now)
		}
		// The other program changed it back; the sync plans its repair.
		if tr.Hold(addr) {
			held++
			continue
		}
		repairs++
		backedOff = append(backedOff, tr.Record(plan.Report{addr}, nil, now)...)
		tr.Expire(now)
	}
	if len(backedOff) != 1 || backedOff[0].Rate != "5 repairs in 4s" {
		t.Fatalf("backed off %+v", backedOff)
	}
	// 5 at once, then one after each of the 3 resyncs in the 2 minutes.
	if repairs != 8 || held != 112 {
		t.Errorf("repairs %d held %d, want 8 and 112", repairs, held)
	}
	fs := tr.Fights()
	if len(fs) != 1 || fs[0].Repairs != 3 {
		t.Fatalf("fights %+v", fs)
	}
	d := tr.Describe(fs[0], "NetworkManager")
	for _, want := range []string{"address 10.10.50.1/24 on enp7s0.50", "5 repairs in 4s", "noprefixroute, valid_lft 300sec", "once per resync", "most likely NetworkManager"} {
		if !strings.Contains(d, want) {
			t.Errorf("description lacks %q: %s", want, d)
		}
	}
	// The program stopped at 120 s: the next resync (150 s) repairs, and
	// the repair holds; a window later the object is let go.
	stop := t0.Add(120 * time.Second)
	if !tr.Hold(addr) {
		t.Error("repaired before the next resync")
	}
	tr.Tick(t0.Add(150 * time.Second))
	if tr.Hold(addr) {
		t.Fatal("held at the resync after the fight")
	}
	tr.Record(plan.Report{addr}, nil, t0.Add(150*time.Second))
	if got := tr.Expire(stop.Add(89 * time.Second)); len(got) != 0 {
		t.Errorf("let go before a window passed: %v", got)
	}
	if got := tr.Expire(stop.Add(90 * time.Second)); len(got) != 1 {
		t.Errorf("not let go a window after the last repair: %v", got)
	}
	if tr.Hold(addr) || len(tr.Fights()) != 0 {
		t.Error("still backed off")
	}
}

// Objects are counted one by one; an entry that only reports, a failed
// one and a guarded one (the kill switch's) are not repairs.
func TestRecordCountsPerObject(t *testing.T) {
	tr := Tracker{Bound: 3, Window: time.Minute}
	now := time.Unix(1000, 0)
	a, b := entry(plan.KindAddress, "address A"), entry(plan.KindAddress, "address B")
	ks := plan.Entry{Subsystem: plan.Routes, Kind: plan.KindRoute, Action: plan.Add, Object: "route unreachable default table 150"}
	pending := plan.Entry{Subsystem: plan.Links, Kind: plan.KindLink, Action: plan.NotApplied, Object: "link x"}
	guarded := func(e plan.Entry) bool { return e.Object == ks.Object }
	for i := 0; i < 10; i++ {
		r := plan.Report{ks, pending, b}
		if i < 2 {
			r = append(r, a, a)
		}
		tr.Record(r, guarded, now.Add(time.Duration(i)*time.Second))
	}
	fs := tr.Fights()
	if len(fs) != 1 || fs[0].Object != "address B" {
		t.Errorf("fights %+v, want only address B", fs)
	}
	if tr.Hold(ks) || tr.Hold(a) {
		t.Error("held what is not backed off")
	}
	// Repairs spread wider than the window never back off.
	tr = Tracker{Bound: 3, Window: time.Minute}
	for i := 0; i < 10; i++ {
		tr.Record(plan.Report{a}, nil, now.Add(time.Duration(i)*31*time.Second))
		tr.Expire(now.Add(time.Duration(i) * 31 * time.Second))
	}
	if len(tr.Fights()) != 0 {
		t.Errorf("slow repairs backed off: %+v", tr.Fights())
	}
	tr.Reset()
	if len(tr.Fights()) != 0 {
		t.Error("reset kept fights")
	}
}
