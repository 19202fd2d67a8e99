package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRegions: nodeagent regions lists the cached server list's region
// ids with their names, port forwarding marked, and the list's age, for
// the list the config's PIA device uses (even when its region is a typo,
// which the list is there to correct); with no list cached it fails
// saying where it looked and what fetches one.
func TestRegions(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	cfg := filepath.Join(dir, "nodeagent.yaml")

	// Nothing cached.
	err := Regions(&bytes.Buffer{}, Options{Config: cfg, StateDir: stateDir})
	if err == nil || !strings.Contains(err.Error(), "no PIA server list is cached under "+stateDir+"/pia: nodeagent run fetches it") {
		t.Fatalf("no list cached: %v", err)
	}

	listKey := cacheTestList(t, dir, stateDir)
	lists, _ := filepath.Glob(filepath.Join(stateDir, "pia", "list-*.txt"))
	if len(lists) != 1 {
		t.Fatalf("cached lists: %v", lists)
	}
	cachedAt := time.Now().Add(-50 * time.Hour)
	os.Chtimes(lists[0], cachedAt, cachedAt)
	os.WriteFile(filepath.Join(dir, "pia.cred"), []byte("u\np\n"), 0o600)
	os.WriteFile(cfg, []byte("wireguard:\n  - name: wg-pia\n    pia:\n      region: nl_amsterdm\n      credentialsFile: "+filepath.Join(dir, "pia.cred")+
		"\n      serverList: "+testListURL+"\n      serverListKeyFile: "+listKey+"\n"), 0o644)
	var out bytes.Buffer
	if err := Regions(&out, Options{Config: cfg, StateDir: stateDir}); err != nil {
		t.Fatalf("regions: %v\n%s", err, out.String())
	}
	want := []string{
		"PIA server list " + testListURL + ", cached " + cachedAt.UTC().Format("2006-01-02 15:04") + " UTC (2d ago): 3 regions, 2 with port forwarding (PF)",
		`REGION +PF +NAME`,
		`de_berlin +PF +DE Berlin`,
		`nl_amsterdam +PF +Netherlands`,
		// No PF; offline; the escape in its name is not printed.
		`us_east +US East\?\[2J \(offline\)`,
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("regions printed:\n%s", out.String())
	}
	for i, w := range want {
		if i == 0 && lines[0] != w || i > 0 && !regexp.MustCompile("^"+w+"$").MatchString(lines[i]) {
			t.Errorf("line %d: %q, want %q", i+1, lines[i], w)
		}
	}
	if strings.ContainsRune(out.String(), 0x1b) {
		t.Errorf("regions printed an escape character from the list")
	}
}
