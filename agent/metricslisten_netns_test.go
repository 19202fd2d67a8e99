package agent

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/bindwait"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestMetricsListenerWaitsForItsAddress is issue 45's acceptance 4: the
// metrics listener is bound to the node's address on its uplink, which
// (as DHCP or networkd would) arrives 10 s after the daemon started. The
// daemon starts and converges without it, logs once that the listener
// waits, and answers a scrape within one retry of the address being added
// (at most the retry timer's longest interval, plus slack; the kernel's
// address event makes it much sooner). The figure is printed.
func TestMetricsListenerWaitsForItsAddress(t *testing.T) {
	const addr = "192.0.2.10:9477"
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "enp1s0", peer, "eth0")
	cfg := filepath.Join(t.TempDir(), "nodeagent.yaml")
	os.WriteFile(cfg, []byte(`dad: {disabled: true}
macvlans:
  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}
checks:
  gatewayARP: false
`), 0o600)
	started := time.Now()
	r := startDaemon(t, node, cfg, func(o *RunOptions) { o.MetricsAddr = addr })
	t.Logf("ready %s after start, without the listener's address", time.Since(started).Round(time.Millisecond))

	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: node.Host.DialContext, DisableKeepAlives: true}}
	scrape := func() (string, bool) {
		resp, err := client.Get("http://" + addr + "/metrics")
		if err != nil {
			return "", false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err == nil && resp.StatusCode == http.StatusOK
	}
	if _, ok := scrape(); ok {
		t.Fatal("a scrape answered before the address was on the node")
	}
	waits := func() int { return strings.Count(r.log.String(), "metrics listener is waiting for its address") }
	waitFor(t, "the listener's wait logged", 5*time.Second, func() bool { return waits() > 0 })

	time.Sleep(time.Until(started.Add(10 * time.Second)))
	added := time.Now()
	node.Exec(t, "ip", "addr", "add", "192.0.2.10/24", "dev", "enp1s0")
	var body string
	waitFor(t, "a scrape at "+addr, 30*time.Second, func() bool {
		var ok bool
		body, ok = scrape()
		if !ok {
			time.Sleep(20 * time.Millisecond)
		}
		return ok
	})
	took := time.Since(added)
	bound := bindwait.DefaultBackoff.Delay(64) + 2*time.Second
	t.Logf("address added %s after start; first successful scrape %s after the address (bound: %s, one retry interval plus 2s)",
		added.Sub(started).Round(time.Millisecond), took.Round(time.Millisecond), bound)
	if took > bound {
		t.Errorf("the first scrape answered %s after the address was added, more than one retry interval plus slack (%s)", took, bound)
	}
	if !strings.Contains(body, "nodeagent_ready 1") {
		t.Errorf("the scrape has no nodeagent_ready 1:\n%.2000s", body)
	}
	if n := waits(); n != 1 {
		t.Errorf("the wait was logged %d times, want once", n)
	}
	if !strings.Contains(r.log.String(), "metrics listener: its address is on the node; listening") {
		t.Error("the bind after the wait was not logged")
	}
}
