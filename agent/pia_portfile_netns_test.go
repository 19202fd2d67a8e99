package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// TestPIAPortFileGoes: /run/nodeagent/pia/DEV.port outlived port
// forwarding: turned off, or the device removed from the config, a reader
// still found the last port. The file goes with the port, comes back with
// it, and a daemon started on a config without port forwarding removes
// one an earlier run left.
func TestPIAPortFileGoes(t *testing.T) {
	l, _ := pfLab(t, piastub.Options{})
	withPF, _ := os.ReadFile(l.Config)
	// One socket, so one port directory, for both daemons of the test.
	socket := filepath.Join(l.Dir, "run", "nodeagent.sock")
	os.MkdirAll(filepath.Dir(socket), 0o755)
	start := func() *running {
		r := startDaemon(t, l.Node, l.Config, func(o *RunOptions) {
			o.StateDir, o.PIATimers, o.Socket = l.StateDir, fastPF, socket
		})
		r.socket = socket
		return r
	}
	file := filepath.Join(filepath.Dir(socket), "pia", l.Dev+".port")
	r := start()
	waitFor(t, "the port bound", 60*time.Second, func() bool { return forwardedPort(r) != 0 })
	checkPublished(t, l, r, forwardedPort(r))
	reload := func(what string, yaml string) {
		t.Helper()
		if err := os.WriteFile(l.Config, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		if res := r.d.Reload(t.Context()); !res.Applied {
			t.Fatalf("%s: reload %+v", what, res)
		}
	}
	gone := func() bool { _, err := os.Stat(file); return os.IsNotExist(err) }

	// Port forwarding turned off.
	noPF := strings.Replace(string(withPF), "enabled: true", "enabled: false", 1)
	noPF = strings.Replace(noPF, "        to: 10.10.50.20\n        toPort: 8080\n", "", 1)
	reload("port forwarding off", noPF)
	waitFor(t, "the port file gone with port forwarding off", 10*time.Second, gone)
	// The metric's series and the endpoint go at once too (issue 39: they
	// kept the old port for ever).
	if v := gauge(t, r, "nodeagent_forwarded_port", "device", l.Dev); v != -1 || r.d.Metrics().ForwardedPort() != 0 {
		t.Errorf("port forwarding off: nodeagent_forwarded_port %v (-1: no series), /v1/portforward's port %d", v, r.d.Metrics().ForwardedPort())
	}

	// On again: the saved port comes back, and so does the file.
	reload("port forwarding on", string(withPF))
	waitFor(t, "the port file back", 30*time.Second, func() bool {
		b, err := os.ReadFile(file)
		return err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(forwardedPort(r)) && forwardedPort(r) != 0
	})

	// The device removed from the config.
	i, j := strings.Index(string(withPF), "wireguard:\n"), strings.Index(string(withPF), "\nrouting:")
	if i < 0 || j < i {
		t.Fatalf("no wireguard section in the lab's config:\n%s", withPF)
	}
	waitFor(t, "the series back with the port", 10*time.Second, func() bool {
		return gauge(t, r, "nodeagent_forwarded_port", "device", l.Dev) == float64(forwardedPort(r)) && r.d.Metrics().ForwardedPort() == forwardedPort(r)
	})
	reload("the device removed", string(withPF)[:i]+string(withPF)[j+1:])
	waitFor(t, "the port file gone with the device", 10*time.Second, gone)
	if v := gauge(t, r, "nodeagent_forwarded_port", "device", l.Dev); v != -1 || r.d.Metrics().ForwardedPort() != 0 {
		t.Errorf("device removed: nodeagent_forwarded_port %v (-1: no series), /v1/portforward's port %d", v, r.d.Metrics().ForwardedPort())
	}

	// Files an earlier run left (its device's, a device gone since),
	// and a daemon started on a config without port forwarding.
	r.stop(t)
	if err := os.WriteFile(l.Config, []byte(noPF), 0o644); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(file), 0o755)
	for name, port := range map[string]string{l.Dev: "47047", "wgother": "47048"} {
		if err := os.WriteFile(filepath.Join(filepath.Dir(file), name+".port"), []byte(port+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r = start()
	waitFor(t, "the left-over port files gone", 10*time.Second, func() bool {
		ents, _ := os.ReadDir(filepath.Dir(file))
		return len(ents) == 0
	})
}
