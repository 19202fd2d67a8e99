package logging

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestJournalLines: under the journal every record is one line that
// starts with its syslog priority and has no time key; attributes,
// groups and quoting are logfmt's as before.
func TestJournalLines(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(NewHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug}, true))
	log.Debug("full plan", "lines", 3)
	log.Info("config loaded", "hash", "ab12")
	log.Log(t.Context(), slog.LevelInfo+2, "notice")
	log.Warn("config rejected", "err", "nodeagent.yaml:3: vlans[0].id: 5000 is out of range\nsecond line")
	log.Error("sync failed", "subsystem", "routes")
	log.Log(t.Context(), slog.LevelError+4, "worse")
	log.With("device", "wg0").WithGroup("peer").Info("added", "key", "k=")

	want := []string{
		`<7>level=DEBUG msg="full plan" lines=3`,
		`<6>level=INFO msg="config loaded" hash=ab12`,
		`<5>level=INFO+2 msg=notice`,
		`<4>level=WARN msg="config rejected" err="nodeagent.yaml:3: vlans[0].id: 5000 is out of range\nsecond line"`,
		`<3>level=ERROR msg="sync failed" subsystem=routes`,
		`<3>level=ERROR+4 msg=worse`,
		`<6>level=INFO msg=added device=wg0 peer.key="k="`,
	}
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), b.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i+1, got[i], want[i])
		}
	}
	if strings.Contains(b.String(), "time=") {
		t.Errorf("a journal line carries time=:\n%s", b.String())
	}
}

// TestPlainLogfmt: anywhere else (a terminal, a pipe, a file) the lines
// are slog's logfmt with their time and no priority prefix.
func TestPlainLogfmt(t *testing.T) {
	var b bytes.Buffer
	log := New(&b, slog.LevelInfo)
	log.Debug("hidden")
	log.Warn("config rejected", "err", "x")
	if !regexp.MustCompile(`^time=\S+ level=WARN msg="config rejected" err=x\n$`).MatchString(b.String()) {
		t.Errorf("plain output %q, want one logfmt line with time=", b.String())
	}

	// A file is the journal only when JOURNAL_STREAM names it: a child
	// inherits the variable with its stderr redirected elsewhere.
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1))
	New(f, slog.LevelInfo).Warn("not the journal")
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	New(f, slog.LevelInfo).Warn("the journal")
	out, _ := os.ReadFile(f.Name())
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "time=") || lines[1] != `<4>level=WARN msg="the journal"` {
		t.Errorf("file output:\n%s\nwant a logfmt line with time=, then the journal's <4> line without", out)
	}
}

func TestJournalDetection(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	for env, want := range map[string]bool{
		fmt.Sprintf("%d:%d", st.Dev, st.Ino):   true,
		fmt.Sprintf("%d:%d", st.Dev+1, st.Ino): false,
		fmt.Sprintf("%d:%d", st.Dev, st.Ino+1): false,
		"":                                     false,
		"garbage":                              false,
		fmt.Sprintf("%d:", st.Dev):             false,
		fmt.Sprintf("0x%x:%d", st.Dev, st.Ino): false,
	} {
		if got := Journal(f, env); got != want {
			t.Errorf("Journal(JOURNAL_STREAM=%q) = %v, want %v", env, got, want)
		}
	}
}

// TestJournalConcurrent: records logged at once from many goroutines (and
// loggers derived with With) come out as whole lines. The writer is a bare
// bytes.Buffer: the handler alone serialises the writes (go test -race).
func TestJournalConcurrent(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(NewHandler(&b, nil, true))
	var wg sync.WaitGroup
	for g := range 8 {
		l := log.With("g", g)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				l.Info("tick", "i", i)
			}
		}()
	}
	wg.Wait()
	line := regexp.MustCompile(`^<6>level=INFO msg=tick g=\d i=\d+$`)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 1600 {
		t.Fatalf("%d lines, want 1600", len(lines))
	}
	for _, l := range lines {
		if !line.MatchString(l) {
			t.Fatalf("torn line %q", l)
		}
	}
}
