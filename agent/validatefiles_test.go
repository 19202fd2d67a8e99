package agent

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
)

// testListURL is the server list the tests cache (cacheTestList).
const testListURL = "https://list.example/v6"

// cacheTestList signs a server list of regions nl_amsterdam (with port
// forwarding), de_berlin and us_east with a key of its own, caches it
// under stateDir as the list of testListURL, and returns the key's PEM
// file for serverListKeyFile.
func cacheTestList(t *testing.T, dir, stateDir string) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	keyFile := filepath.Join(dir, "list.pub.pem")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	line := []byte(`{"groups":{"wg":[{"name":"wireguard","ports":[1337]}]},"regions":[` +
		`{"id":"nl_amsterdam","name":"Netherlands","port_forward":true,"servers":{"wg":[{"ip":"198.18.1.2","cn":"amsterdam401"}]}},` +
		`{"id":"de_berlin","name":"DE Berlin","port_forward":true,"servers":{"wg":[{"ip":"198.18.3.2","cn":"berlin401"}]}},` +
		`{"id":"us_east","name":"US East\u001b[2J","port_forward":false,"offline":true,"servers":{"wg":[{"ip":"198.18.2.2","cn":"newyork403"}]}}]}`)
	sum := sha256.Sum256(line)
	sig, _ := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err := pia.StoreAt(stateDir).SaveList(testListURL, &pia.List{Raw: line, Signature: sig}); err != nil {
		t.Fatal(err)
	}
	return keyFile
}

func testKey(t *testing.T) string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b) + "\n"
}

// TestValidateReadsTheFilesTheConfigNames: validate reads every key,
// credentials and PEM file the config names as the daemon will, and a
// file the daemon would fail on makes the config invalid, reported at the
// line of the field that names it; a PIA region is checked against the
// cached server list (with a suggestion), and when none is cached validate
// says it could not check it. plan prints the same, at the same lines.
func TestValidateReadsTheFilesTheConfigNames(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	listKey := cacheTestList(t, dir, stateDir)
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	write("good.key", testKey(t), 0o600)
	write("garbage.key", "not a key at all\n", 0o600)
	write("open.key", testKey(t), 0o644)
	write("theirs.key", testKey(t), 0o600)
	if os.Geteuid() == 0 {
		os.Chown(filepath.Join(dir, "theirs.key"), 1000, 1000)
	}
	os.Symlink(filepath.Join(dir, "good.key"), filepath.Join(dir, "link.key"))
	write("pia.cred", "user\npassword\n", 0o600)
	write("one.cred", "justtheuser\n", 0o600)
	write("garbage.crt", "no certificate here\n", 0o644)
	os.Mkdir(filepath.Join(dir, "peers.d"), 0o755)

	// wgDev is a device whose key is in keyFile; its privateKeyFile is on line 3.
	wgDev := func(keyFile string) string {
		return "wireguard:\n  - name: wg0\n    privateKeyFile: DIR/" + keyFile + "\n    listenPort: 51820\n    addresses: [10.9.0.1/24]\n    peersDir: DIR/peers.d\n"
	}
	// piaDev is a PIA device in region with credentials cred; region is
	// on line 4, credentialsFile on line 5, caFile on line 8.
	piaDev := func(region, cred, state string) (string, string) {
		return "wireguard:\n  - name: wg-pia\n    pia:\n      region: " + region + "\n      credentialsFile: DIR/" + cred +
			"\n      serverList: " + testListURL + "\n      serverListKeyFile: " + listKey + "\n", state
	}
	noList := filepath.Join(dir, "nostate")
	type tc struct {
		name     string
		cfg      string
		state    string
		wantErr  string // the error's line, after the config's path; "" for valid
		alsoErr  string // more of the error, anywhere in it
		wantWarn string // a warning's text, after "warning: " and the config's path
		rootOnly bool
	}
	cases := []tc{
		{name: "good key", cfg: wgDev("good.key")},
		{name: "missing key", cfg: wgDev("missing.key"), wantErr: ":3: wireguard[0].privateKeyFile: DIR/missing.key does not exist"},
		{name: "garbage key", cfg: wgDev("garbage.key"), wantErr: ":3: wireguard[0].privateKeyFile: DIR/garbage.key: not a WireGuard key (32 bytes of base64)"},
		{name: "key readable by others", cfg: wgDev("open.key"), wantErr: ":3: wireguard[0].privateKeyFile: DIR/open.key is readable by group or others (mode 0644)"},
		{name: "key owned by another user", cfg: wgDev("theirs.key"), wantErr: ":3: wireguard[0].privateKeyFile: DIR/theirs.key is owned by uid 1000, not root", rootOnly: true},
		{name: "symlinked key", cfg: wgDev("link.key"), wantErr: ":3: wireguard[0].privateKeyFile: DIR/link.key is a symbolic link"},
		{name: "missing preshared key", cfg: wgDev("good.key") + "    peers:\n      - name: laptop\n        publicKey: " + strings.TrimSpace(testKey(t)) + "\n        presharedKeyFile: DIR/missing.psk\n        allowedIPs: [10.9.0.2/32]\n",
			wantErr: ":10: wireguard[0].peers[0].presharedKeyFile: DIR/missing.psk does not exist"},
		{name: "missing peersDir", cfg: strings.Replace(wgDev("good.key"), "peers.d", "nopeers.d", 1),
			wantWarn: ":6: wireguard[0].peersDir: DIR/nopeers.d does not exist; the device has no peers from a register until it is made"},
	}
	add := func(name, cfg, state, wantErr, wantWarn string, also ...string) {
		cases = append(cases, tc{name: name, cfg: cfg, state: state, wantErr: wantErr, wantWarn: wantWarn, alsoErr: strings.Join(also, "")})
	}
	cfg, st := piaDev("nl_amsterdam", "pia.cred", stateDir)
	add("pia good", cfg, st, "", "")
	cfg, st = piaDev("nl_amsterdam", "missing.cred", stateDir)
	add("missing pia.cred", cfg, st, ":5: wireguard[0].pia.credentialsFile: DIR/missing.cred does not exist", "")
	cfg, st = piaDev("nl_amsterdam", "one.cred", stateDir)
	add("one-line pia.cred", cfg, st, ":5: wireguard[0].pia.credentialsFile: DIR/one.cred: has 1 lines; want 2 (username, then password)", "")
	cfg, st = piaDev("nl_amsterdam", "pia.cred", stateDir)
	add("garbage caFile", cfg+"      caFile: DIR/garbage.crt\n", st, ":8: wireguard[0].pia.caFile: DIR/garbage.crt holds no PEM certificate", "")
	cfg, st = piaDev("nl_amsterdm", "pia.cred", stateDir)
	add("region typo, list cached", cfg, st, `:4: wireguard[0].pia.region: "nl_amsterdm" is not a region of PIA's server list (cached `, "", "; did you mean nl_amsterdam? (nodeagent regions lists them)")
	cfg, st = piaDev("berlin", "pia.cred", stateDir)
	add("region without its country, list cached", cfg, st, `did you mean de_berlin? (nodeagent regions lists them)`, "")
	cfg, st = piaDev("nl_amsterdm", "pia.cred", noList)
	add("region typo, no list cached", cfg, st, "", `:4: wireguard[0].pia.region: "nl_amsterdm" cannot be checked: no PIA server list is cached under `+noList+`/pia yet`)

	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			if tt.rootOnly && os.Geteuid() != 0 {
				t.Skip("needs root to give the file away")
			}
			path := filepath.Join(dir, "nodeagent.yaml")
			if err := os.WriteFile(path, []byte(strings.ReplaceAll(tt.cfg, "DIR", dir)), 0o644); err != nil {
				t.Fatal(err)
			}
			state := tt.state
			if state == "" {
				state = noList
			}
			o := Options{Config: path, StateDir: state, TablesFile: ""}
			var out bytes.Buffer
			err := Validate(&out, o)
			wantErr := strings.ReplaceAll(tt.wantErr, "DIR", dir)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("validate: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("validate passed; want an error %q\n%s", wantErr, out.String())
			case tt.wantErr != "" && !strings.Contains(err.Error(), wantErr):
				t.Fatalf("validate:\n%v\nwant %q", err, wantErr)
			case tt.wantErr == "" && !strings.Contains(out.String(), path+": valid"):
				t.Fatalf("validate printed %q; want %q", out.String(), path+": valid")
			}
			if tt.alsoErr != "" && !strings.Contains(err.Error(), tt.alsoErr) {
				t.Errorf("validate: %v\nwant %q in it", err, tt.alsoErr)
			}
			if strings.HasPrefix(wantErr, ":") && !strings.Contains(err.Error(), path+wantErr) {
				t.Errorf("validate: %v\nwant the line to start with %q", err, path+wantErr)
			}
			wantWarn := "warning: " + path + strings.ReplaceAll(tt.wantWarn, "DIR", dir)
			if tt.wantWarn != "" && !strings.Contains(out.String(), wantWarn) {
				t.Errorf("validate printed:\n%s\nwant %q", out.String(), wantWarn)
			}
			if tt.wantWarn == "" && strings.Contains(out.String(), "warning:") {
				t.Errorf("validate warned:\n%s", out.String())
			}
		})
	}

	// plan reports the same files at the same lines (and plans the rest).
	path := filepath.Join(dir, "nodeagent.yaml")
	cfg, _ = piaDev("nl_amsterdam", "one.cred", noList)
	cfg += strings.TrimPrefix(wgDev("garbage.key"), "wireguard:\n")
	os.WriteFile(path, []byte(strings.ReplaceAll(strings.Replace(cfg, "wg0", "wg1", 1), "DIR", dir)), 0o644)
	var out bytes.Buffer
	if err := Plan(context.Background(), &out, Options{Config: path, StateDir: noList}); err != nil {
		t.Fatalf("plan: %v", err)
	}
	for _, want := range []string{
		"error: " + path + ":5: wireguard[0].pia.credentialsFile: " + dir + "/one.cred: has 1 lines",
		"error: " + path + ":9: wireguard[1].privateKeyFile: " + dir + "/garbage.key: not a WireGuard key",
		"warning: " + path + `:4: wireguard[0].pia.region: "nl_amsterdam" cannot be checked`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan printed:\n%s\nwant a line %q", out.String(), want)
		}
	}
}
