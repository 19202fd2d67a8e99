package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestRefusedFirewallUpdateReplacesTable: the firewall's update refused by
// the kernel (a chain made by hand in nodeagent's table that a verdict map
// made by hand jumps to: deleting the chain first is EBUSY) must not
// freeze the firewall. The daemon replaces the table whole in the same
// sync, the kill switch stays armed and says how, status keeps a note of
// it, and a later change (a reload adding a kill-switch source) reaches
// the kernel.
func TestRefusedFirewallUpdateReplacesTable(t *testing.T) {
	node := testenv.NewNetNS(t)
	lan := testenv.NewNetNS(t)
	node.Veth(t, "vlan50", lan, "eth0")
	node.Exec(t, "ip", "addr", "add", "10.10.50.1/24", "dev", "vlan50")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "nodeagent.yaml")
	write := func(extra string) {
		if err := os.WriteFile(cfg, []byte(`dad: {disabled: true}
firewall:
  killSwitch: [{from: 10.10.50.0/24, allowOut: [tun0]}`+extra+`]
checks: {gatewayARP: false}
`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	r := startDaemon(t, node, cfg, nil)
	d, log := r.d, r.log
	armed := func(reason string) func() bool {
		return func() bool {
			s := d.Status()
			c := s.Condition(api.CondKillSwitchArmed)
			return c != nil && c.Status == api.True && c.Reason == reason
		}
	}
	waitFor(t, "the kill switch armed", 30*time.Second, armed("Armed"))

	// One nft transaction: the daemon repairs a lone hand-made chain
	// before a second command could refer to it.
	node.Exec(t, "nft", "add chain inet nodeagent x; add map inet nodeagent vm { type ipv4_addr : verdict; elements = { 1.2.3.4 : jump x } }")
	waitFor(t, "the table replaced", 30*time.Second, armed("ArmedByReplacement"))
	s := d.Status()
	c := s.Condition(api.CondKillSwitchArmed)
	if !has(c.Message, "replaced whole in one transaction") || !has(c.Message, "busy") {
		t.Errorf("KillSwitchArmed %+v; want it to say the table was replaced, and the kernel's reason", c)
	}
	if out := node.Exec(t, "nft", "list", "table", "inet", "nodeagent"); has(out, "map vm") || has(out, "chain x") || !has(out, "10.10.50.0/24") {
		t.Fatalf("the table is not the config's after the replacement:\n%s", out)
	}
	if !has(log.String(), "its table was replaced whole") {
		t.Error("the log does not say the table was replaced")
	}

	// Later changes still land, and the note stays in status.
	write(", {from: 10.10.70.0/24, allowOut: [tun0]}")
	d.Reload(t.Context())
	waitFor(t, "the reload's source in the kernel", 30*time.Second, func() bool {
		return has(node.Exec(t, "nft", "list", "table", "inet", "nodeagent"), "10.10.70.0/24")
	})
	waitFor(t, "armed again", 30*time.Second, armed("Armed"))
	for _, s := range d.Status().Subsystems {
		if s.Name == "nftables" && !strings.Contains(s.Note, "replaced whole") {
			t.Errorf("status's nftables note %q; want the replacement kept", s.Note)
		}
	}
}
