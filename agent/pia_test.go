package agent

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/route"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
)

// TestValidatePIARegionFromCachedList: with a server list cached under
// the state directory, validate names an unknown region (and a region
// without port forwarding when it is asked for) at its line; without one
// it cannot judge, and the config is valid (with a warning saying so:
// TestValidateReadsTheFilesTheConfigNames). A PIA device needs no
// privateKeyFile.
func TestValidatePIARegionFromCachedList(t *testing.T) {
	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	keyFile := filepath.Join(dir, "list.pub.pem")
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
	line := []byte(`{"groups":{"wg":[{"name":"wireguard","ports":[1337]}]},"regions":[` +
		`{"id":"nl_amsterdam","port_forward":true,"servers":{"wg":[{"ip":"198.18.1.2","cn":"amsterdam401"}]}},` +
		`{"id":"us_east","port_forward":false,"servers":{"wg":[{"ip":"198.18.2.2","cn":"newyork403"}]}}]}`)
	sum := sha256.Sum256(line)
	sig, _ := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	const url = "https://list.example/v6"
	stateDir := filepath.Join(dir, "state")
	if err := pia.StoreAt(stateDir).SaveList(url, &pia.List{Raw: line, Signature: sig}); err != nil {
		t.Fatal(err)
	}
	cred := filepath.Join(dir, "pia.cred")
	os.WriteFile(cred, []byte("u\np\n"), 0o600)
	cfg := filepath.Join(dir, "nodeagent.yaml")
	write := func(region string, pf bool) {
		pfs := "false"
		if pf {
			pfs = "true"
		}
		os.WriteFile(cfg, []byte("wireguard:\n  - name: wg-pia\n    pia:\n      region: "+region+"\n      portForward: "+pfs+
			"\n      credentialsFile: "+cred+"\n      serverList: "+url+"\n      serverListKeyFile: "+keyFile+"\n"), 0o644)
	}
	for _, tt := range []struct {
		region   string
		pf       bool
		stateDir string
		want     string // "" valid
	}{
		{"nl_amsterdam", true, stateDir, ""},
		{"auto", true, stateDir, ""},
		{"nl_rotterdam", false, stateDir, cfg + `:4: wireguard[0].pia.region: "nl_rotterdam" is not a region of PIA's server list (cached `},
		{"us_east", true, stateDir, cfg + `:4: wireguard[0].pia.region: region us_east has no port forwarding`},
		{"nl_rotterdam", false, filepath.Join(dir, "empty"), ""}, // no list cached: not judged
	} {
		write(tt.region, tt.pf)
		var out bytes.Buffer
		err := Validate(&out, Options{Config: cfg, StateDir: tt.stateDir})
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s (portForward %v): %v", tt.region, tt.pf, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s (portForward %v): got %v, want %q", tt.region, tt.pf, err, tt.want)
		}
	}
}

// TestRoutesWaitForTheTunnelAddress: a PIA device without its address yet
// (before its registration) takes no IPv4 route, so nothing forwarded into
// it is masqueraded to another interface's address and kept so by
// conntrack; its IPv6 routes and other devices' routes stay.
func TestRoutesWaitForTheTunnelAddress(t *testing.T) {
	dflt := route.Route{Table: 150, To: netip.MustParsePrefix("0.0.0.0/0"), Dev: "wg-pia"}
	dflt6 := route.Route{Table: 150, To: netip.MustParsePrefix("::/0"), Dev: "wg-pia"}
	shim := route.Route{Table: 150, To: netip.MustParsePrefix("10.10.50.0/24"), Dev: "vlan50-shim"}
	rs := []route.Route{dflt, dflt6, shim}
	got := routesWait(rs, wg.Device{Name: "wg-pia"})
	if want := []route.Route{dflt6, shim}; !slices.Equal(got, want) {
		t.Errorf("without an address: %v, want %v", got, want)
	}
	got = routesWait(rs, wg.Device{Name: "wg-pia", Addrs: []netip.Prefix{netip.MustParsePrefix("10.10.0.3/32")}})
	if !slices.Equal(got, rs) {
		t.Errorf("with its address: %v, want %v", got, rs)
	}
	if len(rs) != 3 {
		t.Error("the routes given were changed")
	}
}
