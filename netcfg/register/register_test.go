package register

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"gopkg.in/yaml.v3"
)

// Keys for the register tests: public keys, and secrets that no error or
// printout may contain.
const (
	keyA = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
	keyB = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="
	keyC = "AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM="
	keyD = "BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQ="
	keyE = "BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU="

	testPSK        = "ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoM="
	testPrivateKey = "yMnKy8zNzs/Q0dLT1NXW19jZ2tvc3d7f4OHi4+Tl5uc="
)

// writeFile writes content to dir/name with exactly mode, and returns the path.
func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask may have narrowed it
		t.Fatal(err)
	}
	return p
}

// registerErrors returns every config.FieldError of reg.Errors formatted, with
// dir's path cut out so tables can name files bare.
func registerErrors(t *testing.T, dir string, errs []error) []string {
	t.Helper()
	var out []string
	for _, err := range errs {
		var list config.ErrorList
		if !errors.As(err, &list) {
			t.Fatalf("error is %T, not config.ErrorList: %v", err, err)
		}
		for _, e := range list {
			s := e.Error()
			if dir != "" {
				s = strings.ReplaceAll(s, dir+string(filepath.Separator), "")
			}
			out = append(out, s)
		}
	}
	return out
}

// assertNoSecret fails if s holds the test preshared or private key, or a
// good part of either.
func assertNoSecret(t *testing.T, what, s string) {
	t.Helper()
	for _, k := range []string{testPSK, testPrivateKey} {
		if strings.Contains(s, k[:12]) {
			t.Errorf("%s contains a secret key:\n%s", what, s)
		}
	}
}

func TestLoadRegister(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "alice.yaml", `# alice's laptop
description: alice's laptop
publicKey: `+keyA+`
presharedKeyFile: /etc/nodeagent/keys/alice.psk
endpoint: "[2001:db8::1]:51820"
allowedIPs:
  - 10.90.0.2/32
  - fd00:90::2/128
persistentKeepalive: 25
`, 0o644)
	writeFile(t, dir, "bob.conf", `# bob's phone, from wg-quick
[peer]
publickey = `+keyB+`   # trailing comment
PresharedKey=`+testPSK+`
AllowedIPs = 10.90.0.3/32, fd00:90::3/128
ALLOWEDIPS = 10.91.0.0/24

Endpoint = vpn.example.org:51820
PersistentKeepalive = off
`, 0o600)
	writeFile(t, dir, "carol.yml", "name: carol-tablet\npublicKey: "+keyC+"\n", 0o644)
	// Without an inline preshared key a wg-quick file may be world readable.
	writeFile(t, dir, "dave.conf", "\uFEFF[Peer]\r\nPublicKey = "+keyD+"\r\nAllowedIPs = 10.90.0.5/32\r\nPersistentKeepalive = 25\r\n", 0o644)

	// Ignored: each would be an error if it were read.
	const garbage = "[Interface]\nthis: is: not a peer\n"
	for _, name := range []string{"README", "notes.txt", ".hidden.yaml", "alice.yaml~", ".alice.yaml.swp",
		".#carol.yml", "#bob.conf#", "alice.yaml.bak", "bob.conf.dpkg-old", "erin.YAML"} {
		writeFile(t, dir, name, garbage, 0o644)
	}
	for _, sub := range []string{"sub", "sub.yaml"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, sub), "x.yaml", garbage, 0o644)
	}

	reg := Load(dir, config.Options{})
	want := Contents{Peers: []Peer{
		{
			File: filepath.Join(dir, "alice.yaml"), Line: 2,
			Peer: config.WGPeer{
				Name:                "alice",
				Description:         "alice's laptop",
				PublicKey:           keyA,
				PresharedKeyFile:    "/etc/nodeagent/keys/alice.psk",
				Endpoint:            "[2001:db8::1]:51820",
				AllowedIPs:          []string{"10.90.0.2/32", "fd00:90::2/128"},
				PersistentKeepalive: 25,
			},
			KeyLine: 3, AllowedIPLines: []int{7, 8},
		},
		{
			File: filepath.Join(dir, "bob.conf"), Line: 2,
			Peer: config.WGPeer{
				Name:       "bob",
				PublicKey:  keyB,
				Endpoint:   "vpn.example.org:51820",
				AllowedIPs: []string{"10.90.0.3/32", "fd00:90::3/128", "10.91.0.0/24"},
			},
			PresharedKey: testPSK,
			KeyLine:      3, AllowedIPLines: []int{5, 5, 6},
		},
		{
			File: filepath.Join(dir, "carol.yml"), Line: 1,
			Peer:    config.WGPeer{Name: "carol-tablet", PublicKey: keyC},
			KeyLine: 2,
		},
		{
			File: filepath.Join(dir, "dave.conf"), Line: 1,
			Peer:    config.WGPeer{Name: "dave", PublicKey: keyD, AllowedIPs: []string{"10.90.0.5/32"}, PersistentKeepalive: 25},
			KeyLine: 2, AllowedIPLines: []int{3},
		},
	}}
	if diff := cmp.Diff(want, reg); diff != "" {
		t.Errorf("Load (-want +got):\n%s", diff)
	}
}

func TestLoadRegisterErrors(t *testing.T) {
	bigPeer := "publicKey: " + keyA + "\n"
	bigPeer += strings.Repeat("#", maxPeerFileSize-len(bigPeer)-1) + "\n"

	tests := []struct {
		name, file, src string
		want            []string
	}{
		// YAML: the config's decoder and peer checks, with bare field paths.
		{"unknown field", "bob.yaml", "publickey: " + keyA + "\n", []string{
			`bob.yaml:1: publickey: unknown field (did you mean "publicKey"?)`,
			`bob.yaml:1: publicKey: required`,
		}},
		{"private key field", "bob.yaml", "publicKey: " + keyA + "\nprivateKey: " + testPrivateKey + "\n", []string{
			`bob.yaml:2: privateKey: unknown field`,
		}},
		{"duplicate key", "bob.yaml", "publicKey: " + keyA + "\npublicKey: " + keyB + "\n", []string{
			`bob.yaml:2: publicKey: duplicate key (first set on line 1)`,
		}},
		{"string for int", "bob.yaml", "publicKey: " + keyA + "\npersistentKeepalive: \"25\"\n", []string{
			`bob.yaml:2: persistentKeepalive: expected an integer, got "25"`,
		}},
		{"allowedIPs not a list", "bob.yaml", "publicKey: " + keyA + "\nallowedIPs: 10.90.0.2/32\n", []string{
			`bob.yaml:2: allowedIPs: expected a list, got "10.90.0.2/32"`,
		}},
		{"public key missing", "bob.yaml", "# bob\nallowedIPs: [10.90.0.2/32]\n", []string{
			`bob.yaml:2: publicKey: required`,
		}},
		{"bad public key", "bob.yml", "publicKey: abc\n", []string{
			`bob.yml:1: publicKey: "abc" is not a WireGuard key (32 bytes of base64, 44 characters ending in '=')`,
		}},
		{"endpoint without port", "bob.yaml", "publicKey: " + keyA + "\nendpoint: vpn.example.org\n", []string{
			`bob.yaml:2: endpoint: "vpn.example.org" is not host:port (use [addr]:port for IPv6)`,
		}},
		{"allowedIPs with host bits", "bob.yaml", "publicKey: " + keyA + "\nallowedIPs:\n  - 10.90.0.2/32\n  - 10.90.0.3/24\n", []string{
			`bob.yaml:4: allowedIPs[1]: "10.90.0.3/24" has host bits set; did you mean 10.90.0.0/24?`,
		}},
		{"allowed IP twice", "bob.yaml", "publicKey: " + keyA + "\nallowedIPs:\n  - 10.90.0.2/32\n  - 10.90.0.2/32\n", []string{
			`bob.yaml:4: allowedIPs[1]: duplicate allowed IP 10.90.0.2/32; first at allowedIPs[0] (line 3)`,
		}},
		{"keepalive out of range", "bob.yaml", "publicKey: " + keyA + "\npersistentKeepalive: 70000\n", []string{
			`bob.yaml:2: persistentKeepalive: 70000 is outside 0-65535`,
		}},
		{"relative preshared key file", "bob.yaml", "publicKey: " + keyA + "\npresharedKeyFile: keys/bob.psk\n", []string{
			`bob.yaml:2: presharedKeyFile: "keys/bob.psk" is not an absolute path`,
		}},
		{"preshared key instead of its file", "bob.yaml", "publicKey: " + keyA + "\npresharedKeyFile: " + testPSK + "\n", []string{
			`bob.yaml:2: presharedKeyFile: this is a key itself, not the path of a file holding one; put the key in a file readable by root only and name that file here`,
		}},
		{"top level is a list", "bob.yaml", "- publicKey: " + keyA + "\n", []string{
			`bob.yaml:1: expected a mapping of peer fields, like publicKey and allowedIPs; got a list`,
		}},
		{"top level is a key", "bob.yaml", testPrivateKey + "\n", []string{
			`bob.yaml:1: expected a mapping of peer fields, like publicKey and allowedIPs; got a single value`,
		}},
		{"empty yaml", "bob.yaml", "# nothing yet\n", []string{
			`bob.yaml: publicKey: required`,
		}},
		{"yaml syntax", "bob.yaml", "publicKey: " + keyA + "\n\tallowedIPs: []\n", []string{
			`bob.yaml:2: invalid YAML: found a tab character that violates indentation`,
		}},
		{"second document", "bob.yaml", "publicKey: " + keyA + "\n---\npublicKey: " + keyB + "\n", []string{
			`bob.yaml:3: a second YAML document; nodeagent reads exactly one, so put everything in one document`,
		}},
		{"every yaml error at once", "bob.yaml", "publicKey: abc\nendpoint: x\nallowedIPs: [10.0.0.1]\npersistentKeepalive: -1\nmtu: 1420\n", []string{
			`bob.yaml:1: publicKey: "abc" is not a WireGuard key (32 bytes of base64, 44 characters ending in '=')`,
			`bob.yaml:2: endpoint: "x" is not host:port (use [addr]:port for IPv6)`,
			`bob.yaml:3: allowedIPs[0]: "10.0.0.1" has no prefix length; write it like 10.0.0.1/32`,
			`bob.yaml:4: persistentKeepalive: -1 is outside 0-65535`,
			`bob.yaml:5: mtu: unknown field`,
		}},

		// wg-quick: errors name wg's keys.
		{"interface profile", "bob.conf", "[Interface]\nPrivateKey = " + testPrivateKey + "\nAddress = 10.90.0.2/32\n\n[Peer]\nPublicKey = " + keyA + "\n", []string{
			`bob.conf:1: [Interface]: an [Interface] section holds a machine's own private key, which must not sit in the register (this looks like a client's wg-quick profile); remove this file, keep the private key on the client, and write a [Peer] stanza with the client's public key instead`,
		}},
		{"interface after peer", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\n[ interface ]\nPrivateKey = " + testPrivateKey + "\n", []string{
			`bob.conf:3: [Interface]: an [Interface] section holds a machine's own private key, which must not sit in the register (this looks like a client's wg-quick profile); remove this file, keep the private key on the client, and write a [Peer] stanza with the client's public key instead`,
		}},
		{"private key in peer", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nPrivateKey = " + testPrivateKey + "\n", []string{
			`bob.conf:3: PrivateKey: a private key does not belong in the register; PublicKey takes the peer's public key (wg pubkey derives it), and the private key stays on the peer`,
		}},
		{"second peer", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\n\n[Peer]\nPublicKey = " + keyB + "\n", []string{
			`bob.conf:4: [Peer]: a second [Peer] stanza (the first is on line 1); a register file holds one peer, so give each its own file`,
		}},
		{"unknown key", "bob.conf", "[Peer]\nPublicKy = " + keyA + "\n", []string{
			`bob.conf:1: PublicKey: required`,
			`bob.conf:2: PublicKy: unknown key (did you mean "PublicKey"?)`,
		}},
		{"interface key in peer", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nAddress = 10.90.0.2/32\n", []string{
			`bob.conf:3: Address: unknown key`,
		}},
		{"key before the header", "bob.conf", "PublicKey = " + keyA + "\n[Peer]\nPublicKey = " + keyA + "\n", []string{
			`bob.conf:1: PublicKey: outside a [Peer] section; start the stanza with [Peer]`,
		}},
		{"no peer", "bob.conf", "# nothing yet\n", []string{
			`bob.conf: no [Peer] stanza; a register file holds one peer, as a [Peer] stanza or in YAML`,
		}},
		{"unclosed header", "bob.conf", "[Peer\nPublicKey = " + keyA + "\n", []string{
			`bob.conf:1: not Key = Value, a [Peer] header or a # comment (the line is not shown, in case it holds a key)`,
		}},
		{"unknown section", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\n[Peers]\nEndpoint = x:1\n", []string{
			`bob.conf:3: [Peers]: unknown section; a register file holds one [Peer] stanza`,
		}},
		{"a bare key on a line", "bob.conf", "[Peer]\n" + testPrivateKey + "\nPublicKey = " + keyA + "\n", []string{
			`bob.conf:2: not Key = Value, a [Peer] header or a # comment (the line is not shown, in case it holds a key)`,
		}},
		{"line without equals", "bob.conf", "[Peer]\nPublicKey " + keyA + "\n", []string{
			`bob.conf:1: PublicKey: required`,
			`bob.conf:2: not Key = Value, a [Peer] header or a # comment (the line is not shown, in case it holds a key)`,
		}},
		{"bad preshared key", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nPresharedKey = " + testPSK[:30] + "\n", []string{
			`bob.conf:3: PresharedKey: not a WireGuard key (32 bytes of base64, 44 characters ending in '='); the value is not shown, as it is secret`,
		}},
		{"preshared key twice", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nPresharedKey = " + testPSK + "\npresharedkey = " + testPSK + "\n", []string{
			`bob.conf:4: PresharedKey: duplicate key (first set on line 3)`,
		}},
		{"public key twice", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\npublickey = " + keyB + "\n", []string{
			`bob.conf:3: PublicKey: duplicate key (first set on line 2)`,
		}},
		{"keepalive word", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nPersistentKeepalive = often\n", []string{
			`bob.conf:3: PersistentKeepalive: "often" is not a number of seconds (0-65535) or off`,
		}},
		{"keepalive out of range", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nPersistentKeepalive = 70000\n", []string{
			`bob.conf:3: PersistentKeepalive: 70000 is outside 0-65535`,
		}},
		{"empty list entry", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nAllowedIPs = 10.90.0.2/32,,10.90.0.3/32\n", []string{
			`bob.conf:3: AllowedIPs: empty entry in the list`,
		}},
		{"allowed IP without length", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nAllowedIPs = 10.90.0.2\n", []string{
			`bob.conf:3: AllowedIPs: "10.90.0.2" has no prefix length; write it like 10.90.0.2/32`,
		}},
		{"allowed IP on two lines", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nAllowedIPs = 10.90.0.2/32\nAllowedIPs = 10.90.0.3/32, 10.90.0.2/32\n", []string{
			`bob.conf:4: AllowedIPs: duplicate allowed IP 10.90.0.2/32; first at AllowedIPs (line 3)`,
		}},
		{"wg public key missing", "bob.conf", "[Peer]\nAllowedIPs = 10.90.0.2/32\n", []string{
			`bob.conf:1: PublicKey: required`,
		}},
		{"wg bad public key", "bob.conf", "[Peer]\nPublicKey = abc\n", []string{
			`bob.conf:2: PublicKey: "abc" is not a WireGuard key (32 bytes of base64, 44 characters ending in '=')`,
		}},
		{"wg endpoint", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\nEndpoint = vpn.example.org\n", []string{
			`bob.conf:3: Endpoint: "vpn.example.org" is not host:port (use [addr]:port for IPv6)`,
		}},
		{"empty value", "bob.conf", "[Peer]\nPublicKey =\n", []string{
			`bob.conf:2: PublicKey: empty value`,
		}},

		// Either format.
		{"too big", "big.yaml", bigPeer + "\n", []string{
			`big.yaml: is too big (65537 bytes; at most 64 KiB)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, tt.file, tt.src, 0o600)
			reg := Load(dir, config.Options{})
			if len(reg.Peers) != 0 {
				t.Errorf("Peers = %+v; want none", reg.Peers)
			}
			if len(reg.Errors) != 1 {
				t.Errorf("%d errors; want one for the file", len(reg.Errors))
			}
			got := registerErrors(t, dir, reg.Errors)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			for _, err := range reg.Errors {
				assertNoSecret(t, "error", err.Error())
			}
		})
	}

	// Exactly 64 KiB is still a peer file.
	dir := t.TempDir()
	writeFile(t, dir, "big.yaml", bigPeer, 0o600)
	if reg := Load(dir, config.Options{}); len(reg.Errors) != 0 || len(reg.Peers) != 1 {
		t.Errorf("64 KiB file: %+v", reg)
	}
}

func TestLoadRegisterDuplicates(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", "publicKey: "+keyA+"\nallowedIPs: [10.90.0.2/32, 10.90.1.0/24]\n", 0o600)
	writeFile(t, dir, "b.conf", "[Peer]\nPublicKey = "+keyA+"\nAllowedIPs = 10.90.0.9/32\n", 0o600)
	writeFile(t, dir, "c.yaml", "publicKey: "+keyC+"\nallowedIPs:\n  - 10.90.0.3/32\n  - 10.90.1.0/24\n", 0o600)
	// b and c were skipped, so what they claimed is free for d.
	writeFile(t, dir, "d.yaml", "publicKey: "+keyD+"\nallowedIPs: [10.90.0.3/32, 10.90.0.9/32]\n", 0o600)
	writeFile(t, dir, "e.conf", "[Peer]\nPublicKey = "+keyD+"\nAllowedIPs = 10.90.0.2/32\n", 0o600)

	reg := Load(dir, config.Options{})
	var names []string
	for _, p := range reg.Peers {
		names = append(names, p.Peer.Name)
	}
	if diff := cmp.Diff([]string{"a", "d"}, names); diff != "" {
		t.Errorf("peers (-want +got):\n%s", diff)
	}
	want := []string{
		`b.conf:2: PublicKey: duplicate peer public key; first in a.yaml:1`,
		`c.yaml:4: allowedIPs[1]: 10.90.1.0/24 is already allowed for the peer in a.yaml:2; WireGuard routes a prefix to one peer only`,
		`e.conf:2: PublicKey: duplicate peer public key; first in d.yaml:1`,
		`e.conf:3: AllowedIPs: 10.90.0.2/32 is already allowed for the peer in a.yaml:2; WireGuard routes a prefix to one peer only`,
	}
	if diff := cmp.Diff(want, registerErrors(t, dir, reg.Errors)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	if len(reg.Errors) != 3 {
		t.Errorf("%d errors; want one per skipped file (3)", len(reg.Errors))
	}
}

func TestLoadRegisterDir(t *testing.T) {
	if reg := Load(filepath.Join(t.TempDir(), "peers.d"), config.Options{}); !cmp.Equal(reg, Contents{}) {
		t.Errorf("missing dir: %+v; want an empty register", reg)
	}
	if reg := Load(t.TempDir(), config.Options{}); !cmp.Equal(reg, Contents{}) {
		t.Errorf("empty dir: %+v; want an empty register", reg)
	}

	notDir := writeFile(t, t.TempDir(), "peers.d", "", 0o600)
	reg := Load(notDir, config.Options{})
	want := []string{notDir + ": cannot read the directory: not a directory"}
	if diff := cmp.Diff(want, registerErrors(t, "", reg.Errors)); diff != "" || reg.Peers != nil {
		t.Errorf("dir is a file: peers %v, errors (-want +got):\n%s", reg.Peers, diff)
	}

	if os.Geteuid() == 0 {
		t.Log("running as root, which reads any directory; skipping the unreadable directory")
		return
	}
	locked := filepath.Join(t.TempDir(), "peers.d")
	if err := os.Mkdir(locked, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, locked, "a.yaml", "publicKey: "+keyA+"\n", 0o600)
	if err := os.Chmod(locked, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(locked, 0o700) })
	reg = Load(locked, config.Options{})
	want = []string{locked + ": cannot read the directory: permission denied"}
	if diff := cmp.Diff(want, registerErrors(t, "", reg.Errors)); diff != "" || reg.Peers != nil {
		t.Errorf("unreadable dir: peers %v, errors (-want +got):\n%s", reg.Peers, diff)
	}
}

func TestRegisterFileChecks(t *testing.T) {
	keys := t.TempDir()
	openPSK := writeFile(t, keys, "open.psk", "x\n", 0o644)
	closedPSK := writeFile(t, keys, "closed.psk", "x\n", 0o600)
	withPSK := "[Peer]\nPublicKey = " + keyA + "\nPresharedKey = " + testPSK + "\n"

	tests := []struct {
		name, file, src string
		mode            os.FileMode
		opts            config.Options
		want            []string
	}{
		{"inline preshared key world readable", "bob.conf", withPSK, 0o644, config.Options{}, []string{
			`bob.conf:3: PresharedKey: this file holds a preshared key but is readable by group or others (mode 0644); chmod 600 it`,
		}},
		{"inline preshared key group readable", "bob.conf", withPSK, 0o640, config.Options{}, []string{
			`bob.conf:3: PresharedKey: this file holds a preshared key but is readable by group or others (mode 0640); chmod 600 it`,
		}},
		{"inline preshared key owner only", "bob.conf", withPSK, 0o600, config.Options{}, nil},
		{"inline preshared key, checks skipped", "bob.conf", withPSK, 0o644, config.Options{SkipFileChecks: true}, nil},
		{"no preshared key", "bob.conf", "[Peer]\nPublicKey = " + keyA + "\n", 0o644, config.Options{}, nil},
		{"world readable preshared key file", "bob.yaml", "publicKey: " + keyA + "\npresharedKeyFile: " + openPSK + "\n", 0o644, config.Options{}, []string{
			`bob.yaml:2: presharedKeyFile: ` + openPSK + ` is readable by group or others (mode 0644); chmod 600 it`,
		}},
		{"owner-only preshared key file", "bob.yaml", "publicKey: " + keyA + "\npresharedKeyFile: " + closedPSK + "\n", 0o644, config.Options{}, nil},
		{"preshared key file, checks skipped", "bob.yaml", "publicKey: " + keyA + "\npresharedKeyFile: " + openPSK + "\n", 0o644, config.Options{SkipFileChecks: true}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, tt.file, tt.src, tt.mode)
			reg := Load(dir, tt.opts)
			if diff := cmp.Diff(tt.want, registerErrors(t, dir, reg.Errors)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if len(reg.Peers)+len(reg.Errors) != 1 {
				t.Errorf("%d peers and %d errors; want one of either", len(reg.Peers), len(reg.Errors))
			}
		})
	}
}

func TestRegisterSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	elsewhere := t.TempDir()
	target := writeFile(t, elsewhere, "alice.yaml", "publicKey: "+keyA+"\n", 0o600)
	os.Mkdir(filepath.Join(dir, "real"), 0o755)
	writeFile(t, filepath.Join(dir, "real"), "bob.yaml", "publicKey: "+keyC+"\n", 0o600)
	os.Mkdir(filepath.Join(dir, "subdir"), 0o755)
	// Links are followed only while they stay inside the register: a link
	// out of it could make the daemon read (and its errors print) any file.
	for link, to := range map[string]string{
		"alice.yaml":   target,                                           // a peer kept elsewhere: refused
		"sub.yaml":     elsewhere,                                        // a directory elsewhere: refused
		"gone.yaml":    filepath.Join(elsewhere, "gone.yaml"),            // dangling, elsewhere: refused
		"climb.yaml":   "../" + filepath.Base(elsewhere) + "/alice.yaml", // out by "..": refused
		"bob.yaml":     "real/bob.yaml",                                  // inside: read
		"inner.yaml":   "subdir",                                         // a directory inside: ignored
		"nothing.yaml": "real/nothing.yaml",                              // dangling inside
	} {
		if err := os.Symlink(to, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	// A FIFO must be refused without blocking on its open.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	if !root {
		writeFile(t, dir, "locked.yaml", "publicKey: "+keyB+"\n", 0)
	}

	reg := Load(dir, config.Options{})
	want := []Peer{{File: filepath.Join(dir, "bob.yaml"), Line: 1, Peer: config.WGPeer{Name: "bob", PublicKey: keyC}, KeyLine: 1}}
	if diff := cmp.Diff(want, reg.Peers); diff != "" {
		t.Errorf("peers (-want +got):\n%s", diff)
	}
	out := "is a symbolic link that leads out of " + dir + "; only links to files inside it are followed"
	wantErrs := []string{
		`alice.yaml: ` + out,
		`climb.yaml: ` + out,
		`fifo.yaml: is not a regular file (a FIFO)`,
		`gone.yaml: ` + out,
	}
	if !root {
		wantErrs = append(wantErrs, `locked.yaml: cannot be read: permission denied`)
	}
	wantErrs = append(wantErrs, `nothing.yaml: does not exist`, `sub.yaml: `+out)
	if diff := cmp.Diff(wantErrs, registerErrors(t, dir, reg.Errors)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}

func TestMergePeers(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "b.yaml", "publicKey: "+keyA+"\nallowedIPs: [10.90.0.9/32]\n", 0o600)
	writeFile(t, dir, "c.conf", "[Peer]\nPublicKey = "+keyC+"\nAllowedIPs = 10.90.0.3/32\nAllowedIPs = 10.90.2.0/24\n", 0o600)
	writeFile(t, dir, "d.yaml", "publicKey: "+keyD+"\nallowedIPs: [10.90.0.4/32]\n", 0o600)
	reg := Load(dir, config.Options{})
	if len(reg.Errors) != 0 {
		t.Fatalf("Load: %v", reg.Errors)
	}
	static := []config.WGPeer{
		{Name: "gw", PublicKey: keyA, AllowedIPs: []string{"10.90.0.2/32"}},
		{Name: "nas", PublicKey: keyE, AllowedIPs: []string{"10.90.2.0/24"}},
	}
	where := func(i int) string { return fmt.Sprintf("nodeagent.yaml wireguard[0].peers[%d]", i) }

	got, errs := Merge(static, where, reg)
	want := []Peer{{Peer: static[0]}, {Peer: static[1]}, reg.Peers[2]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("peers (-want +got):\n%s", diff)
	}
	wantErrs := []string{
		`b.yaml:1: publicKey: duplicate peer public key; first in nodeagent.yaml wireguard[0].peers[0]`,
		`c.conf:4: AllowedIPs: 10.90.2.0/24 is already allowed for the peer in nodeagent.yaml wireguard[0].peers[1]; WireGuard routes a prefix to one peer only`,
	}
	if diff := cmp.Diff(wantErrs, registerErrors(t, dir, errs)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}

	// Without staticWhere, and with register peers built in code (no
	// lines but the peer's own); the register is checked against itself too.
	built := Contents{Peers: []Peer{
		{File: "x.conf", Line: 7, Peer: config.WGPeer{PublicKey: keyB, AllowedIPs: []string{"10.90.2.0/24"}}},
		{File: "y.yaml", Peer: config.WGPeer{PublicKey: keyC, AllowedIPs: []string{"10.90.3.0/24"}}},
		{File: "z.yaml", Line: 2, Peer: config.WGPeer{PublicKey: keyD, AllowedIPs: []string{"10.90.3.0/24"}}},
	}}
	got, errs = Merge(static, nil, built)
	want = []Peer{{Peer: static[0]}, {Peer: static[1]}, built.Peers[1]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("built register: peers (-want +got):\n%s", diff)
	}
	wantErrs = []string{
		`x.conf:7: AllowedIPs: 10.90.2.0/24 is already allowed for the peer in peers[1]; WireGuard routes a prefix to one peer only`,
		`z.yaml:2: allowedIPs[0]: 10.90.3.0/24 is already allowed for the peer in y.yaml; WireGuard routes a prefix to one peer only`,
	}
	if diff := cmp.Diff(wantErrs, registerErrors(t, "", errs)); diff != "" {
		t.Errorf("built register: errors (-want +got):\n%s", diff)
	}

	// No static peers: the register as it is.
	got, errs = Merge(nil, nil, reg)
	if diff := cmp.Diff(reg.Peers, got); diff != "" || errs != nil {
		t.Errorf("no static peers: errors %v, peers (-want +got):\n%s", errs, diff)
	}
}

func TestSecretRedaction(t *testing.T) {
	s := Secret(testPSK)
	if s.Value() != testPSK {
		t.Errorf("Value() = %q", s.Value())
	}
	for _, verb := range []string{"%v", "%+v", "%s", "%x", "%X", "%d", "%10s", "%-20v"} {
		if got := fmt.Sprintf(verb, s); strings.TrimSpace(got) != "(redacted)" {
			t.Errorf("Sprintf(%q) = %q", verb, got)
		}
	}
	for _, verb := range []string{"%q", "%#v"} {
		if got := fmt.Sprintf(verb, s); got != `"(redacted)"` {
			t.Errorf("Sprintf(%q) = %q", verb, got)
		}
	}
	if got := fmt.Sprint(s) + fmt.Sprintln(s) + s.String() + s.GoString(); strings.Count(got, "(redacted)") != 4 {
		t.Errorf("Sprint, Sprintln, String, GoString = %q", got)
	}
	if got := fmt.Sprintf("%v", Secret("")); got != "" {
		t.Errorf("empty Secret prints %q; want nothing", got)
	}

	p := Peer{File: "bob.conf", Line: 1, Peer: config.WGPeer{Name: "bob", PublicKey: keyB}, PresharedKey: s}
	outputs := map[string]string{}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		outputs[verb] = fmt.Sprintf(verb, p)
		outputs[verb+" pointer"] = fmt.Sprintf(verb, &p)
		outputs[verb+" slice"] = fmt.Sprintf(verb, []Peer{p})
	}
	for name, v := range map[string]any{"peer": p, "register": Contents{Peers: []Peer{p}}, "map value": map[string]Secret{"k": s}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		outputs["json "+name] = string(b)
	}
	y, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	outputs["yaml"] = string(y)
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("peer", "psk", s, "peer", p)
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("peer", "psk", s, "peer", p)
	outputs["slog"] = logs.String()
	for name, out := range outputs {
		assertNoSecret(t, name, out)
		if !strings.Contains(out, "(redacted)") {
			t.Errorf("%s does not show the key as (redacted): %s", name, out)
		}
	}
	if !strings.Contains(outputs["json peer"], `"PresharedKey":"(redacted)"`) {
		t.Errorf("json = %s", outputs["json peer"])
	}
}

// FuzzRegisterPeer checks that no register file makes the parsers panic,
// that every failure is located in the file, that results are
// deterministic, and that an accepted peer has a valid public key.
func FuzzRegisterPeer(f *testing.F) {
	for _, s := range []string{
		"",
		"publicKey: " + keyA + "\nallowedIPs: [10.90.0.2/32]\n",
		"&a {<<: *a}\n",
		"[Peer]\nPublicKey = " + keyA + "\nAllowedIPs = 10.90.0.2/32, fd00::/64\nPersistentKeepalive = off\n",
		"[Interface]\nPrivateKey = " + testPrivateKey + "\n[Peer]\n",
		"[Peer]\n[Peer]\n",
		"[Peer]\nPresharedKey = " + testPSK + "\nEndpoint = [fd00::1]:51820\n",
		"# c\n[peer] # x\n publickey=" + keyB + "\n",
	} {
		f.Add([]byte(s))
	}
	opts := config.Options{SkipFileChecks: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, file := range []string{"peer.yaml", "peer.conf"} {
			parse := func() (Peer, config.ErrorList) {
				if strings.HasSuffix(file, ".conf") {
					return parseWGQuickPeer(file, data, 0o600, opts)
				}
				return parseYAMLPeer(file, data, opts)
			}
			p, errs := parse()
			p2, errs2 := parse()
			if errs.Error() != errs2.Error() || !cmp.Equal(p, p2) {
				t.Fatalf("%s: second parse differs", file)
			}
			for _, e := range errs {
				if e.File != file || e.Msg == "" || e.Line < 0 {
					t.Fatalf("%s: malformed config.FieldError %#v", file, e)
				}
			}
			if len(errs) == 0 && (!isWGKey(p.Peer.PublicKey) || p.File != file || p.Peer.Name == "") {
				t.Fatalf("%s: accepted %+v", file, p)
			}
		}
	})
}

// TestRegisterCache: an unchanged file is served from the cache, a changed,
// replaced, chmod-ed or removed one is seen, and a file written moments
// before it was read is never trusted on its unchanged identity (file
// times move in clock ticks).
func TestRegisterCache(t *testing.T) {
	dir := t.TempDir()
	write := func(name, allowed string, age time.Duration) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("publicKey: "+keyA+"\nallowedIPs: ["+allowed+"]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-age)
		os.Chtimes(p, old, old)
	}
	allowed := func(r Contents) []string {
		var out []string
		for _, p := range r.Peers {
			out = append(out, strings.Join(p.Peer.AllowedIPs, ","))
		}
		for _, e := range r.Errors {
			out = append(out, "error: "+e.Error())
		}
		return out
	}
	// The cache judges a file "written moments ago" by its change time,
	// which Chtimes cannot move back: the clock moves forward instead.
	shift := time.Hour
	c := Cache{now: func() time.Time { return time.Now().Add(shift) }}
	write("a.yaml", "10.90.0.2/32", time.Hour)
	if got := allowed(c.Load(dir, config.Options{})); !slices.Equal(got, []string{"10.90.0.2/32"}) {
		t.Fatalf("first load: %v", got)
	}
	// Poison the cached result: a hit must serve it, a miss must not.
	poison := func() {
		c.mu.Lock()
		for k, e := range c.files {
			e.p.Peer.AllowedIPs = []string{"cached"}
			c.files[k] = e
		}
		c.mu.Unlock()
	}
	poison()
	if got := allowed(c.Load(dir, config.Options{})); !slices.Equal(got, []string{"cached"}) {
		t.Errorf("unchanged file not served from the cache: %v", got)
	}
	write("a.yaml", "10.90.0.3/32", time.Hour) // same size, new times
	if got := allowed(c.Load(dir, config.Options{})); !slices.Equal(got, []string{"10.90.0.3/32"}) {
		t.Errorf("changed file: %v", got)
	}
	// Written just now: parsed again every time, even with the same identity.
	shift = 0
	write("a.yaml", "10.90.0.4/32", 0)
	c.Load(dir, config.Options{})
	poison()
	if got := allowed(c.Load(dir, config.Options{})); !slices.Equal(got, []string{"10.90.0.4/32"}) {
		t.Errorf("a file written moments ago was trusted from the cache: %v", got)
	}
	os.Remove(filepath.Join(dir, "a.yaml"))
	if got := allowed(c.Load(dir, config.Options{})); len(got) != 0 {
		t.Errorf("removed file still in the register: %v", got)
	}
	if len(c.files) != 0 {
		t.Errorf("the cache keeps %d entries for removed files", len(c.files))
	}
}

// isWGKey reports whether s is 32 bytes of base64.
func isWGKey(s string) bool {
	b, err := base64.StdEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

// TestLoadStream: the peers LoadStream emits, batch after batch, are
// Contents.Peers exactly and in name order, whatever the reading's timing,
// across many chunks with clashes, broken and ignored files among them;
// and a Merger fed those batches gives what Merge gives, by AddLoaded
// (checked against the static peers only) as by Add.
func TestLoadStream(t *testing.T) {
	dir := t.TempDir()
	key := func(i int) string {
		var k [32]byte
		k[0], k[1] = byte(i), byte(i>>8)
		return base64.StdEncoding.EncodeToString(k[:])
	}
	for i := 0; i < 150; i++ {
		name, body := fmt.Sprintf("p%03d.yaml", i), fmt.Sprintf("publicKey: %s\nallowedIPs: [10.91.%d.%d/32]\n", key(i), i/256, i%256)
		switch {
		case i%17 == 5:
			// The key of a file before it: skipped.
			body = fmt.Sprintf("publicKey: %s\nallowedIPs: [10.92.0.%d/32]\n", key(i-3), i)
		case i%23 == 7:
			// A prefix of a file before it.
			body = fmt.Sprintf("publicKey: %s\nallowedIPs: [10.91.0.%d/32]\n", key(i), i-2)
		case i%29 == 11:
			body = "publicKey: [not a key\n"
		case i%31 == 13:
			name = fmt.Sprintf("p%03d.conf", i)
			body = fmt.Sprintf("[Peer]\nPublicKey = %s\nAllowedIPs = 10.91.%d.%d/32\n", key(i), i/256, i%256)
		}
		writeFile(t, dir, name, body, 0o600)
	}
	writeFile(t, dir, ".p050.yaml.swp", "junk", 0o600)
	writeFile(t, dir, "p060.yaml~", "junk", 0o600)
	os.Mkdir(filepath.Join(dir, "p070.yaml"), 0o755)
	static := []config.WGPeer{{Name: "gw", PublicKey: key(41), AllowedIPs: []string{"10.91.0.100/32"}}}
	where := func(i int) string { return fmt.Sprintf("static[%d]", i) }
	c := &Cache{}
	for run := 0; run < 3; run++ { // cold, then from the cache
		var emitted []Peer
		batches := 0
		m, merged := NewMerger(static, where)
		m2, merged2 := NewMerger(static, where)
		var mergeErrs, mergeErrs2 []error
		reg := c.LoadStream(dir, config.Options{}, func(ps []Peer) {
			if len(ps) == 0 {
				t.Error("an empty batch")
			}
			batches++
			emitted = append(emitted, ps...)
			keep, errs := m.AddLoaded(ps)
			merged, mergeErrs = append(merged, keep...), append(mergeErrs, errs...)
			keep2, errs2 := m2.Add(ps)
			merged2, mergeErrs2 = append(merged2, keep2...), append(mergeErrs2, errs2...)
		})
		if diff := cmp.Diff(reg.Peers, emitted); diff != "" {
			t.Fatalf("run %d: emitted peers differ from the load's (-load +emitted):\n%s", run, diff)
		}
		if !slices.IsSortedFunc(emitted, func(a, b Peer) int { return strings.Compare(a.File, b.File) }) {
			t.Errorf("run %d: peers not emitted in name order", run)
		}
		if len(reg.Peers) < 100 || len(reg.Errors) < 15 {
			t.Fatalf("run %d: %d peers, %d errors; the register should give over 100 and 15", run, len(reg.Peers), len(reg.Errors))
		}
		if plain := Load(dir, config.Options{}); !cmp.Equal(plain.Peers, reg.Peers) || !slices.Equal(registerErrors(t, dir, plain.Errors), registerErrors(t, dir, reg.Errors)) {
			t.Errorf("run %d: LoadStream and Load differ", run)
		}
		want, wantErrs := Merge(static, where, reg)
		if diff := cmp.Diff(want, merged); diff != "" {
			t.Errorf("run %d: Merger (-Merge +Merger):\n%s", run, diff)
		}
		if diff := cmp.Diff(registerErrors(t, dir, wantErrs), registerErrors(t, dir, mergeErrs)); diff != "" || len(wantErrs) == 0 {
			t.Errorf("run %d: Merger errors (-Merge +Merger):\n%s", run, diff)
		}
		if !cmp.Equal(merged, merged2) || !slices.Equal(registerErrors(t, dir, mergeErrs), registerErrors(t, dir, mergeErrs2)) {
			t.Errorf("run %d: AddLoaded and Add differ", run)
		}
		t.Logf("run %d: %d peers in %d batches, %d skipped files", run, len(emitted), batches, len(reg.Errors))
		if run == 0 {
			time.Sleep(racyWindow + 100*time.Millisecond) // so the cache trusts what it parsed
		}
	}
}
