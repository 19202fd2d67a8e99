package soak

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
)

// TestScheduleReplays: a seed is its schedule. The same seed gives the
// same faults, another seed others; over an hour every kind comes up;
// faults that own a resource never overlap one that holds it, and no
// more than MaxActive are under way at once.
func TestScheduleReplays(t *testing.T) {
	a := Schedule(12345, time.Hour, DefaultSchedule)
	b := Schedule(12345, time.Hour, DefaultSchedule)
	if ScheduleText(a) != ScheduleText(b) || ScheduleHash(a) != ScheduleHash(b) {
		t.Fatal("the same seed gave two schedules")
	}
	if c := Schedule(12346, time.Hour, DefaultSchedule); ScheduleText(c) == ScheduleText(a) {
		t.Fatal("two seeds gave one schedule")
	}
	seen := map[string]int{}
	for i, f := range a {
		seen[f.Kind]++
		k := kindOf(f.Kind)
		if f.At+f.For+k.tail > time.Hour {
			t.Errorf("%s ends after the hour", f)
		}
		active := 0
		for _, g := range a[:i] {
			gk := kindOf(g.Kind)
			if g.At+g.For+gk.tail <= f.At {
				continue
			}
			active++
			for _, r := range k.owns {
				if slices.Contains(gk.owns, r) || slices.Contains(gk.uses, r) {
					t.Errorf("%s overlaps %s on %s", f, g, r)
				}
			}
		}
		if active >= DefaultSchedule.MaxActive {
			t.Errorf("%s starts with %d faults under way", f, active)
		}
	}
	for _, k := range Kinds {
		if seen[k.name] == 0 {
			t.Errorf("an hour of seed 12345 has no %s", k.name)
		}
	}
	t.Logf("an hour of seed 12345: %d faults, %v", len(a), seen)
}

// TestNFTKillSwitch: the monitor's reading of table inet nodeagent (a
// listing by nft of the soak's own) finds both kill switches armed, and
// names what is missing when a rule, a source or the device is not there.
func TestNFTKillSwitch(t *testing.T) {
	b, err := os.ReadFile("testdata/nodeagent-table.txt")
	if err != nil {
		t.Fatal(err)
	}
	listing := string(b)
	if m := nftKillSwitch(listing, "wgpia1234"); len(m) != 0 {
		t.Fatalf("armed table read as missing %v", m)
	}
	for name, broken := range map[string]string{
		"no drop rule": strings.Replace(listing, `ip saddr @ks_wgpia1234_v4 oifname != @ks_wgpia1234_out counter name "ks_drops" drop`, "", 1),
		"no source":    strings.Replace(listing, "elements = { 10.10.50.0/24 }\n\t}\n\n\tset ks_wgpia1234_to", "elements = { 10.10.51.0/24 }\n\t}\n\n\tset ks_wgpia1234_to", 1),
		"accept":       strings.Replace(listing, `ip daddr != @ks_wgpia1234_to_192.168.2.0-24_v4_to oifname != @ks_wgpia1234_to_192.168.2.0-24_out counter name "ks_drops" drop`, `ip daddr != @ks_wgpia1234_to_192.168.2.0-24_v4_to oifname != @ks_wgpia1234_to_192.168.2.0-24_out counter name "ks_drops" accept`, 1),
		"empty":        "",
	} {
		if broken == listing {
			t.Fatalf("%s: the edit did not apply", name)
		}
		if m := nftKillSwitch(broken, "wgpia1234"); len(m) == 0 {
			t.Errorf("%s: read as armed", name)
		}
	}
	if m := nftKillSwitch(listing, "wgpia9999"); len(m) == 0 {
		t.Error("another device's kill switch read as this one's")
	}
}

// The API server is shared by the package's soaks (its start is half a
// minute of a run).
var (
	kubeOnce sync.Once
	kube     *kubetest.Server
	kubeErr  error
)

func sharedKube(t *testing.T) *kubetest.Server {
	kubetest.Require(t)
	kubeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nodeagent-soak-kube-")
		if err != nil {
			kubeErr = err
			return
		}
		kube, kubeErr = kubetest.New(dir)
		if kubeErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		kubeErr = kube.Start(ctx, t.Logf)
	})
	if kubeErr != nil {
		t.Fatal(kubeErr)
	}
	return kube
}

func TestMain(m *testing.M) {
	code := m.Run()
	if kube != nil {
		kube.Stop()
	}
	os.Exit(code)
}

// buildNodeagent builds the daemon, with tags.
func buildNodeagent(t *testing.T, tags string) string {
	bin := filepath.Join(t.TempDir(), "nodeagent")
	args := []string{"build", "-o", bin}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, "../../cmd/nodeagent")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nodeagent: %v\n%s", err, out)
	}
	return bin
}

// envDuration is NAME's duration, or def.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

func soakOptions(t *testing.T, bin string) Options {
	example, err := os.ReadFile(filepath.Join("..", "..", ExampleFile))
	if err != nil {
		t.Fatal(err)
	}
	logs := filepath.Join("..", "..", ".cache", "test", "soak-"+strings.ReplaceAll(t.Name(), "/", "-"))
	os.RemoveAll(logs)
	var seed uint64
	if s := os.Getenv("NODEAGENT_SOAK_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	return Options{Nodeagent: bin, Example: example, LogDir: logs, Kube: sharedKube(t), Seed: seed, Out: testWriter{t}}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestSoak is CI's soak: five minutes of the nemesis (NODEAGENT_SOAK
// sets another length, NODEAGENT_SOAK_SEED the seed) against the
// homelab, every invariant checked the whole time; `make soak SOAK=60m`
// is the long run.
func TestSoak(t *testing.T) {
	testenv.RequireRoot(t)
	if testenv.InVM() {
		t.Skip("the host tier runs the soak: the VM has no etcd or kube-apiserver")
	}
	o := soakOptions(t, buildNodeagent(t, ""))
	o.Duration = envDuration(t, "NODEAGENT_SOAK", 5*time.Minute)
	o.Replay = "NODEAGENT_SOAK=" + o.Duration.String() + " NODEAGENT_SOAK_SEED=%d go test -run TestSoak$ ./testenv/soak"
	res := Run(t, o)
	for _, v := range res.Violations {
		t.Errorf("seed %d: %s", res.Seed, v)
	}
}

// TestSoakCanFail is acceptance 3: a daemon built broken on purpose
// (-tags soakbreak: once someone deleted its table, it makes it again
// without the kill switch) fails the soak, at the first deletion of the
// table the nemesis makes, naming the invariant and the seed. The seed
// is the first whose schedule deletes the table within 20 s, so the proof
// costs CI a minute, not five.
func TestSoakCanFail(t *testing.T) {
	testenv.RequireRoot(t)
	if testenv.InVM() {
		t.Skip("the host tier runs the soak")
	}
	o := soakOptions(t, buildNodeagent(t, "soakbreak"))
	o.Duration = 5 * time.Minute
	o.StopOnViolation = true
	for seed := uint64(1); o.Seed == 0; seed++ {
		for _, f := range Schedule(seed, o.Duration, DefaultSchedule) {
			if f.Kind == "del-nft-table" && f.At < 20*time.Second {
				o.Seed = seed
			}
		}
	}
	o.Replay = "go test -run TestSoakCanFail ./testenv/soak (seed %d)"
	start := time.Now()
	res := Run(t, o)
	if len(res.Violations) == 0 {
		t.Fatalf("seed %d: the broken daemon passed the soak", res.Seed)
	}
	v := res.Violations[0]
	t.Logf("seed %d failed the soak %s after the nemesis began (%s in all): %s", res.Seed, fmtDur(v.At), fmtDur(time.Since(start)), v)
	if v.Invariant != invArmed || !strings.Contains(v.Detail, layerNFT) {
		t.Errorf("the first violation is %q, want %q naming the %s", v.Invariant, invArmed, layerNFT)
	}
	if v.At > 5*time.Minute {
		t.Errorf("the soak failed only %s in", v.At)
	}
	if !strings.Contains(Report(res, o.Duration), "seed "+strconv.FormatUint(res.Seed, 10)) {
		t.Error("the report does not name the seed")
	}
}
