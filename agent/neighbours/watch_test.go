package neighbours

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/hazard"
)

// A repair is put down to the hazards that delete its kind, each logged
// once for the daemon's life whatever the number of repairs; a repair no
// hazard explains is logged once per kind.
func TestRepairCausesLoggedOncePerCause(t *testing.T) {
	var buf bytes.Buffer
	d := &Neighbours{o: Options{Log: slog.New(slog.NewTextHandler(&buf, nil))}}
	d.found = []hazard.Hazard{
		{Source: "systemd-networkd (default)", What: "ManageForeignRoutingPolicyRules=yes deletes rules", Fix: "set it to no", Kinds: []string{"rule"}},
		{Source: "systemd-networkd (default)", What: "ManageForeignRoutes=yes deletes routes", Fix: "set it to no", Kinds: []string{"route"}},
	}
	for range 5 {
		d.Causes(map[string]int{"rule": 2, "route": 2})
	}
	if !d.Causes(map[string]int{"nftables": 1}) {
		t.Error("an unexplained kind seen for the first time was not logged")
	}
	if d.Causes(map[string]int{"nftables": 3, "rule": 1}) {
		t.Error("causes already logged were logged again")
	}
	out := buf.String()
	t.Logf("log:\n%s", out)
	for _, want := range []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes=yes", "no known neighbour explains it"} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("%q logged %d times, want once", want, n)
		}
	}
	if n := strings.Count(out, "fix=\"set it to no\""); n != 2 {
		t.Errorf("the fix was logged %d times, want once per cause (2)", n)
	}
	if n := strings.Count(out, "level=WARN"); n != 3 {
		t.Errorf("%d WARN lines, want 3 (two causes, one unexplained kind)", n)
	}
}

// The watch sees a drop-in written into a networkd.conf.d made after it
// started, not only files in the directories that existed.
func TestWatchNeighboursSeesNewDropIn(t *testing.T) {
	root := t.TempDir()
	etc := filepath.Join(root, "etc", "systemd")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed := make(chan struct{}, 64)
	watchNeighbours(ctx, hazard.Paths{Root: root}, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	drain := func() {
		for {
			select {
			case <-changed:
			case <-time.After(200 * time.Millisecond):
				return
			}
		}
	}
	wait := func(what string) {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatalf("no change reported for %s", what)
		}
	}
	dropins := filepath.Join(etc, "networkd.conf.d")
	if err := os.Mkdir(dropins, 0o755); err != nil {
		t.Fatal(err)
	}
	wait("the new networkd.conf.d")
	drain()
	if err := os.WriteFile(filepath.Join(dropins, "nodeagent.conf"), []byte("[Network]\nManageForeignRoutes=no\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wait("a drop-in in it")
	drain()
	if err := os.WriteFile(filepath.Join(root, "unrelated"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
		t.Error("a file outside networkd's search path was reported")
	case <-time.After(300 * time.Millisecond):
	}
}
