package register

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/config"
)

const fastKey = "SRVpubKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="

// full is what the full parser makes of data.
func full(data []byte) (Peer, config.ErrorList) {
	peer, line, pf, errs := config.DecodePeerYAML("p.yaml", data, MaxFileErrors)
	if errs != nil {
		return Peer{}, errs
	}
	return registerPeer(pf, line, peer, "", config.Options{SkipFileChecks: true})
}

// fast is what the fast path makes of data, and whether it vouches for it.
func fast(data []byte) (Peer, bool) {
	peer, line, pf, ok := fastYAMLPeer("p.yaml", data)
	if !ok {
		return Peer{}, false
	}
	p, errs := registerPeer(pf, line, peer, "", config.Options{SkipFileChecks: true})
	return p, errs == nil
}

// checkSame fails when the fast path vouches for data and the full parser
// reads it otherwise.
func checkSame(t *testing.T, data []byte) bool {
	t.Helper()
	fp, ok := fast(data)
	if !ok {
		return false
	}
	want, errs := full(data)
	if errs != nil {
		t.Fatalf("%q: the fast path read a peer the full parser refuses: %v", data, errs)
	}
	if d := cmp.Diff(want, fp); d != "" {
		t.Fatalf("%q: fast path differs (-full +fast):\n%s", data, d)
	}
	return true
}

var fastSeeds = []string{
	"publicKey: " + fastKey + "\nallowedIPs: [10.90.0.2/32]\n",
	"# alice's phone\nname: alice-phone\ndescription: Alice (phone)\npublicKey: " + fastKey + "\nallowedIPs: [10.90.0.2/32, fd90::2/128]\npersistentKeepalive: 25\nendpoint: vpn.example.org:51820\n",
	"\n\npublicKey: " + fastKey + "\n\nallowedIPs: []\n",
	"publicKey: " + fastKey + "\nallowedIPs: [10.90.0.2/32,10.90.1.0/24]\npresharedKeyFile: /etc/nodeagent/keys/alice.psk\n",
	"allowedIPs: [10.90.0.2/32]\npublicKey: " + fastKey,
	"publicKey: +" + fastKey[1:] + "\nallowedIPs: [10.90.0.3/32]\n",
	// Not for the fast path: the full parser decides.
	"publicKey: +5\n",
	"endpoint: +.inf\npublicKey: " + fastKey + "\n",
	"endpoint: +1_000\npublicKey: " + fastKey + "\n",
	"endpoint: +0x1F\npublicKey: " + fastKey + "\n",
	"publicKey: \"" + fastKey + "\"\nallowedIPs: [10.90.0.2/32]\n",
	"publicKey: " + fastKey + "\nallowedIPs:\n  - 10.90.0.2/32\n",
	"publicKey: " + fastKey + "\nallowedIPs: [10.90.0.2/32] # phone\n",
	"name: yes\npublicKey: " + fastKey + "\n",
	"name: 123\npublicKey: " + fastKey + "\n",
	"publicKey: " + fastKey + "\npersistentKeepalive: 025\n",
	"publicKey: " + fastKey + "\r\nallowedIPs: [10.90.0.2/32]\r\n",
	"publicKey: " + fastKey + "\npublicKey: " + fastKey + "\n",
	"publicKey: &a " + fastKey + "\nname: *a\n",
	"publicKey: not-a-key\n",
	"endpoint: [fd00::1]:51820\npublicKey: " + fastKey + "\n",
	"publicKey: " + fastKey + "\nallowedIPs: [10.90.0.300/32]\n",
	"description: null\npublicKey: " + fastKey + "\n",
}

// TestFastPathMatches: the common files go by the fast path and read as
// the full parser reads them; the rest is left to the full parser.
func TestFastPathMatches(t *testing.T) {
	taken := 0
	for _, s := range fastSeeds {
		if checkSame(t, []byte(s)) {
			taken++
		}
	}
	if taken != 6 {
		t.Errorf("the fast path took %d of the seeds, want the 6 common ones", taken)
	}
}

// FuzzFastPath: whatever the input, a peer the fast path reads is the one
// the full parser reads (same fields, lines, name), and what it cannot
// vouch for goes to the full parser, whose errors are the only ones.
func FuzzFastPath(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSame(t, data)
	})
}
