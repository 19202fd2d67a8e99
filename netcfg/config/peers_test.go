package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	keyA           = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
	keyB           = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="
	testPrivateKey = "yMnKy8zNzs/Q0dLT1NXW19jZ2tvc3d7f4OHi4+Tl5uc="
)

// TestStaticPeersShareTheChecks covers what the register's refactoring
// changed in the main config's static peers.
func TestStaticPeersShareTheChecks(t *testing.T) {
	c, err := parseTest(t, "wireguard:\n  - name: wg0\n    privateKeyFile: /etc/nodeagent/keys/wg0.key\n    peers:\n      - name: laptop\n        description: alice's laptop\n        publicKey: "+keyA+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.WireGuard[0].Peers[0].Description; got != "alice's laptop" {
		t.Errorf("Description = %q", got)
	}
	tests := []struct{ name, src, want string }{
		{"allowed IP twice in one peer",
			"wireguard:\n  - name: wg0\n    privateKeyFile: /k\n    peers:\n      - publicKey: " + keyA + "\n        allowedIPs: [10.90.0.2/32, 10.90.0.2/32]\n",
			`nodeagent.yaml:6: wireguard[0].peers[0].allowedIPs[1]: duplicate allowed IP 10.90.0.2/32; first at wireguard[0].peers[0].allowedIPs[0] (line 6)`},
		{"allowed IP in two peers",
			"wireguard:\n  - name: wg0\n    privateKeyFile: /k\n    peers:\n      - publicKey: " + keyA + "\n        allowedIPs: [10.90.0.2/32]\n      - publicKey: " + keyB + "\n        allowedIPs: [10.90.0.2/32]\n",
			`nodeagent.yaml:8: wireguard[0].peers[1].allowedIPs[0]: 10.90.0.2/32 is already allowed for the peer at wireguard[0].peers[0].allowedIPs[0] (line 6); WireGuard routes a prefix to one peer only`},
		{"key pasted as the private key file",
			"wireguard:\n  - name: wg0\n    privateKeyFile: " + testPrivateKey + "\n",
			`nodeagent.yaml:3: wireguard[0].privateKeyFile: this is a key itself, not the path of a file holding one; put the key in a file readable by root only and name that file here`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseTest(t, tt.src)
			if diff := cmp.Diff([]string{tt.want}, errorStrings(t, err)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if err != nil && strings.Contains(err.Error(), testPrivateKey[:12]) {
				t.Errorf("error contains the private key:\n%s", err)
			}
		})
	}
}
