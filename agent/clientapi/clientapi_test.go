package clientapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/config"
)

// TestAddRefusals: what peer add refuses, it refuses before writing
// anything, with the reason and the HTTP status the CLI turns into its
// exit 1: no clients.endpoint, a full subnet, a name in use, --via
// without --full-tunnel, a pool that is not there.
func TestAddRefusals(t *testing.T) {
	dir := t.TempDir()
	peers := filepath.Join(dir, "peers.d")
	os.Mkdir(peers, 0o755)
	pub := func() string { k, _ := wgtypes.GeneratePrivateKey(); return k.PublicKey().String() }
	// A /29 whose five hosts besides the device's own are taken.
	for i := 2; i <= 6; i++ {
		os.WriteFile(filepath.Join(peers, fmt.Sprintf("p%d.yaml", i)), fmt.Appendf(nil, "publicKey: %s\nallowedIPs: [10.90.0.%d/32]\n", pub(), i), 0o644)
	}
	wg := func(clients *config.Clients) *config.Config {
		return &config.Config{File: "nodeagent.yaml", WireGuard: []config.WireGuard{{Name: "wg0", ListenPort: 51820, Addresses: []string{"10.90.0.1/29"}, PeersDir: peers, Clients: clients}}}
	}
	m := New(func() api.Status { return api.Status{} }, nil)
	for _, tc := range []struct {
		name string
		cfg  *config.Config
		req  api.PeerAdd
		code int
		want string
	}{
		{"no endpoint", wg(nil), api.PeerAdd{Name: "phone"}, http.StatusConflict, "wg0 has no clients.endpoint in nodeagent.yaml"},
		{"full", wg(&config.Clients{Endpoint: "vpn.example.org:51820"}), api.PeerAdd{Name: "phone"}, http.StatusConflict, "wg0: no free address in 10.90.0.0/29 (6 in use)"},
		{"name in use", wg(&config.Clients{Endpoint: "vpn.example.org:51820"}), api.PeerAdd{Name: "p3"}, http.StatusConflict, "the name p3 is in use"},
		{"via without full tunnel", wg(&config.Clients{Endpoint: "vpn.example.org:51820"}), api.PeerAdd{Name: "x", Via: "wg-pia"}, http.StatusBadRequest, "--via wg-pia needs --full-tunnel"},
		{"no pool", wg(&config.Clients{Endpoint: "vpn.example.org:51820"}), api.PeerAdd{Name: "x", Via: "wg-pia", FullTunnel: true}, http.StatusBadRequest, "wg0 has no clients.egress pool"},
		{"bad expiry", wg(&config.Clients{Endpoint: "vpn.example.org:51820"}), api.PeerAdd{Name: "x", Expires: "yesterday"}, http.StatusBadRequest, "expires:"},
		{"bad name", wg(&config.Clients{Endpoint: "vpn.example.org:51820"}), api.PeerAdd{Name: "../x"}, http.StatusBadRequest, "is not a client name"},
		{"no device", wg(&config.Clients{Endpoint: "vpn.example.org:51820"}), api.PeerAdd{Name: "x", Device: "wg9"}, http.StatusNotFound, `no WireGuard device "wg9"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m.SetConfig(tc.cfg)
			tc.req.PublicKey = pub()
			_, err := m.Add(context.Background(), tc.req)
			var e *Error
			if !errors.As(err, &e) || e.Code != tc.code || !strings.Contains(e.Msg, tc.want) {
				t.Fatalf("Add: %v, want %d with %q", err, tc.code, tc.want)
			}
			entries, _ := os.ReadDir(peers)
			if len(entries) != 5 {
				t.Errorf("the register holds %d files, want the 5 it had", len(entries))
			}
		})
	}
}
