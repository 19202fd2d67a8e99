package pia

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// A provider driven by a test as the daemon's loop drives it, against an
// HTTPS test server standing in for every PIA host, on a clock the test
// moves: what a provider does over minutes or days runs in milliseconds,
// and nothing depends on how fast the machine is.

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
	// m is the monotonic side: Add moves both, Step the wall clock alone.
	m time.Time
}

func newFakeClock() *fakeClock {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	return &fakeClock{t: start, m: start}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Mono is the monotonic clock's reading, as a time.
func (c *fakeClock) Mono() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t, c.m = c.t.Add(d), c.m.Add(d)
	c.mu.Unlock()
}

// Step steps the wall clock by d, as NTP does; the monotonic clock stays.
func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// hits records the requests the test server had, by path, at the fake
// clock's time.
type hits struct {
	mu  sync.Mutex
	clk *fakeClock
	at  map[string][]time.Time
}

func (h *hits) note(path string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.at[path] = append(h.at[path], h.clk.Now())
}

// all is every request's time, in order (the clock only moves forward).
func (h *hits) all() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Time
	for _, ts := range h.at {
		out = append(out, ts...)
	}
	sortTimes(out)
	return out
}

func (h *hits) times(path string) []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Time(nil), h.at[path]...)
}

func (h *hits) count(path string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.at[path])
}

func sortTimes(ts []time.Time) {
	for i := 1; i < len(ts); i++ {
		for j := i; j > 0 && ts[j].Before(ts[j-1]); j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
}

// testServer is the wg server of the test list: amsterdam401 at
// 198.18.1.2, in region nl.
var testServer = Server{IP: "198.18.1.2", CN: "amsterdam401"}

// rig is a provider, its test server and its clock.
type rig struct {
	t      *testing.T
	p      *Provider
	events chan Event
	clk    *fakeClock
	hits   *hits
	key    wg.Key
	ca     *testCA
	// listKey signs the server list (signListLine).
	listKey *rsa.PrivateKey
}

// rigOptions shape a rig: the timers, the saved state, whether a list is
// cached (and when it was), the node's reserved prefixes.
type rigOptions struct {
	timers   Timers
	saved    Saved
	noList   bool
	listAge  time.Duration
	reserved []netip.Prefix
}

// newRig starts a provider for device "wgpia0" in region nl with h
// answering every request (the token host at 127.0.0.1, the list host,
// addKey and port forwarding all reach it).
func newRig(t *testing.T, o rigOptions, h http.HandlerFunc) *rig {
	t.Helper()
	ca := newTestCA(t)
	clk := newFakeClock()
	hs := &hits{clk: clk, at: map[string][]time.Time{}}
	cert := ca.leaf(t, testServer.CN, []string{testServer.CN}, []net.IP{net.IPv4(127, 0, 0, 1)})
	a, _ := serve(t, cert, func(w http.ResponseWriter, r *http.Request) {
		hs.note(r.URL.Path)
		h(w, r)
	})
	a.Roots, a.WebRoots = ca.pool, ca.pool
	listKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	a.ListKey = &listKey.PublicKey
	dir := t.TempDir()
	cred := filepath.Join(dir, "pia.cred")
	if err := os.WriteFile(cred, []byte("p1234567\nhunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var k wg.Key
	rand.Read(k[:])
	k = k.Clamped()
	b := Boot{Key: k, Saved: o.saved}
	if b.Saved.Reg != nil {
		b.Saved.Reg.PublicKey = k.PublicKey().String()
	}
	if !o.noList {
		b.List = signedTestList(t, listKey, testList)
		b.ListAt = clk.Now().Add(-o.listAge)
	}
	events := make(chan Event, 16)
	cfg := Config{Device: "wgpia0", Region: "nl", CredentialsFile: cred, API: a, Store: Store{Dir: filepath.Join(dir, "state")},
		Timers: o.timers, Reserved: o.reserved}
	p := New(cfg, b, events, nil)
	p.now, p.mono = clk.Now, clk.Mono
	return &rig{t: t, p: p, events: events, clk: clk, hits: hs, key: k, ca: ca, listKey: listKey}
}

// busy reports whether a call of the provider's is in flight.
func (r *rig) busy() bool { return r.p.seq != 0 || r.p.pfBusy || r.p.dnsBusy || r.p.probing }

// step is one pass of the loop at the clock's time: Step with obs, then
// every call's result handed back (each of which steps again), until no
// call is in flight. It fails the test past max results at one instant:
// a provider that keeps asking without the clock moving is a storm.
func (r *rig) step(obs Observation, max int) {
	r.t.Helper()
	ctx := context.Background()
	r.p.Step(ctx, obs)
	for n := 0; r.busy(); n++ {
		if n >= max {
			r.t.Fatalf("%d calls at one instant (%s): a storm", n, r.clk.Now())
		}
		select {
		case ev := <-r.events:
			r.p.Handle(ctx, ev)
		case <-time.After(30 * time.Second):
			// A guard against a hang, never a measurement.
			r.t.Fatal("a call's result did not come within 30s")
		}
	}
}

// testList is a list with region nl: one wg server, no meta server (the
// token comes from the token host).
var testList = `{"groups":{"wg":[{"name":"wireguard","ports":[1337]}]},"regions":[` +
	`{"id":"nl","port_forward":true,"servers":{"wg":[{"ip":"198.18.1.2","cn":"amsterdam401"}]}}]}`

func signedTestList(t *testing.T, key *rsa.PrivateKey, line string) *List {
	t.Helper()
	l, err := ParseList([]byte(signListLine(key, line)), &key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// signListLine is line as the list host serves it, signed with key.
func signListLine(key *rsa.PrivateKey, line string) string {
	sum := sha256.Sum256([]byte(line))
	sig, _ := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	return line + "\n\n" + base64.StdEncoding.EncodeToString(sig) + "\n"
}

// addKeyAnswer is a good addKey answer for pub, with changes.
func addKeyAnswer(pub wgtypes.Key, change map[string]any) []byte {
	srv, _ := wgtypes.GeneratePrivateKey()
	m := map[string]any{"status": "OK", "server_key": srv.PublicKey().String(), "server_port": 1337,
		"server_ip": "198.18.1.2", "server_vip": "10.10.0.1", "peer_ip": "10.10.0.3",
		"peer_pubkey": pub.String(), "dns_servers": []string{"10.0.0.243", "10.0.0.242"}}
	for k, v := range change {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

// goodReg is a registration as addKey gives it, made at.
func goodReg(at time.Time) *Registration {
	srv, _ := wgtypes.GeneratePrivateKey()
	return &Registration{Region: "nl", Server: testServer, ServerKey: srv.PublicKey().String(), ServerIP: netip.MustParseAddr("198.18.1.2"),
		ServerPort: 1337, ServerVIP: netip.MustParseAddr("10.10.0.1"), PeerIP: netip.MustParseAddr("10.10.0.3"),
		DNS: []netip.Addr{netip.MustParseAddr("10.0.0.243"), netip.MustParseAddr("10.0.0.242")}, At: at}
}
