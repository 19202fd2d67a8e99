package pia

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

type httpDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// Defaults of PIA's public hosts.
const (
	DefaultServerList = "https://serverlist.piaservers.net/vpninfo/servers/v6"
	DefaultTokenURL   = "https://www.privateinternetaccess.com/api/client/v2/token"
)

// apiTimeout bounds every call to PIA.
const apiTimeout = 10 * time.Second

// maxBody bounds what is read of an answer (they are a few hundred bytes).
const maxBody = 64 << 10

// StatusError is an answer of PIA's other than success, by its HTTP status.
// PIA's error bodies are not documented: nothing here reads them.
type StatusError struct {
	What   string
	Status int
	// RetryAfter is what a 429 asks to wait (59 s when it does not say).
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	switch e.Status {
	case http.StatusUnauthorized:
		return e.What + ": credentials rejected (HTTP 401)"
	case http.StatusPaymentRequired:
		return e.What + ": subscription expired (HTTP 402)"
	case http.StatusTooManyRequests:
		return fmt.Sprintf("%s: too many requests (HTTP 429), retrying after %s", e.What, e.RetryAfter)
	}
	return fmt.Sprintf("%s: HTTP %d", e.What, e.Status)
}

// Credentials reports whether the error means the username or password
// (or the subscription) is refused: retrying does not help.
func (e *StatusError) Credentials() bool {
	return e.Status == http.StatusUnauthorized || e.Status == http.StatusPaymentRequired
}

// ErrLoginFailed is addKey's answer to a token it does not accept: get a
// new token.
var ErrLoginFailed = errors.New("addKey: Login failed (the token is not accepted)")

func statusError(what string, resp *http.Response) error {
	e := &StatusError{What: what, Status: resp.StatusCode}
	if resp.StatusCode == http.StatusTooManyRequests {
		e.RetryAfter = 59 * time.Second
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s >= 0 && s <= 3600 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
	}
	return e
}

// readJSON decodes a bounded answer into v.
func readJSON(what string, resp *http.Response, v any) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if len(body) > maxBody {
		return fmt.Errorf("%s: answer over %d bytes", what, maxBody)
	}
	if err := json.Unmarshal(body, v); err != nil {
		// The body is not quoted: it may carry a token.
		return fmt.Errorf("%s: the answer is not the JSON expected", what)
	}
	return nil
}

// API talks to PIA: its web hosts (the token host, the list host) and its
// servers (meta, WireGuard), from the node's namespace.
type API struct {
	Dial DialFunc
	// Roots is PIA's root, the only trust for its servers.
	Roots *x509.CertPool
	// WebRoots are the roots for the web hosts; nil means the system's.
	WebRoots *x509.CertPool
	ListKey  *rsa.PublicKey
	ListURL  string
	TokenURL string
	// budget, when set, bounds the requests sent (a provider's own copy
	// of the API has one: see Timers.MaxRequests).
	budget *budget
	// Now is the wall clock certificates are checked against; nil is
	// time.Now (a provider's copy uses the provider's clock).
	Now func() time.Time
}

func (a *API) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *API) web() *http.Client {
	return httpClient(&tls.Config{RootCAs: a.WebRoots, MinVersion: tls.VersionTLS12, Time: a.now}, a.Dial, "", apiTimeout, a.budget)
}

func (a *API) server(s Server, port int) *http.Client {
	return httpClient(pinned(a.Roots, s.CN, a.now), a.Dial, net.JoinHostPort(s.IP, strconv.Itoa(port)), apiTimeout, a.budget)
}

// newRequest is http.NewRequestWithContext whose error never quotes the
// URL: it may carry a token, a port payload or its signature.
func newRequest(ctx context.Context, what, method, u string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%s: the request's URL does not parse", what)
	}
	return req, nil
}

// serverOK checks a server's cn and IP before anything is sent to it: the
// cn goes into the URL and the TLS name, the IP is dialled as it is.
func serverOK(what string, s Server) error {
	if !ValidCN(s.CN) {
		return fmt.Errorf("%s: the server's cn is not a host name; not asked", what)
	}
	if a, err := netip.ParseAddr(s.IP); err != nil || unicast4(a) != "" {
		return fmt.Errorf("%s: the server's IP is not a unicast IPv4 address; not asked", what)
	}
	return nil
}

// List fetches and checks the server list.
func (a *API) List(ctx context.Context) (*List, error) {
	return fetchList(ctx, a.web(), a.ListURL, a.ListKey)
}

// Token gets a token: from the region's meta servers first (reached by IP,
// pinned to PIA's root and the server's cn: no DNS needed), then from the
// token host. A refusal of the credentials (401, 402) or a 429 ends it at
// once: asking elsewhere would not change the answer.
func (a *API) Token(ctx context.Context, c Creds, meta []Server, metaPort int) (Secret, error) {
	var errs []error
	for _, s := range meta {
		what := "meta server " + s.CN
		if err := serverOK("meta server", s); err != nil {
			errs = append(errs, err)
			continue
		}
		tok, err := a.tokenAt(ctx, a.server(s, metaPort), "https://"+s.CN+"/api/client/v2/token", c, what)
		if err == nil {
			return tok, nil
		}
		var se *StatusError
		if errors.As(err, &se) && (se.Credentials() || se.Status == http.StatusTooManyRequests) {
			return "", err
		}
		if _, ok := clockErrorOf(err, a.now()); ok {
			// Every host's certificate is judged by the same clock.
			return "", err
		}
		if _, ok := budgetOf(err); ok {
			return "", err
		}
		errs = append(errs, err)
	}
	tok, err := a.tokenAt(ctx, a.web(), a.TokenURL, c, "token host")
	if err != nil {
		return "", errors.Join(append(errs, err)...)
	}
	return tok, nil
}

func (a *API) tokenAt(ctx context.Context, hc *http.Client, u string, c Creds, what string) (Secret, error) {
	form := url.Values{"username": {c.Username}, "password": {c.Password.Value()}}
	req, err := newRequest(ctx, what, http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, stripURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", statusError(what, resp)
	}
	var ans struct {
		Token string `json:"token"`
	}
	if err := readJSON(what, resp, &ans); err != nil {
		return "", err
	}
	if ans.Token == "" || len(ans.Token) > 1024 {
		return "", fmt.Errorf("%s: no token in the answer", what)
	}
	return Secret(ans.Token), nil
}

// stripURL drops the URL a *url.Error repeats (it may carry a token).
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// Registration is what addKey gave: the tunnel's peer, address and the
// server's address inside it.
type Registration struct {
	Region     string       `json:"region"`
	Server     Server       `json:"server"` // the wg server: IP and cn
	ServerKey  string       `json:"serverKey"`
	ServerIP   netip.Addr   `json:"serverIP"`
	ServerPort int          `json:"serverPort"`
	ServerVIP  netip.Addr   `json:"serverVIP"`
	PeerIP     netip.Addr   `json:"peerIP"`
	DNS        []netip.Addr `json:"dns"`
	// PublicKey is the key it registered, ours.
	PublicKey string    `json:"publicKey"`
	At        time.Time `json:"at"`
}

// Endpoint is where the tunnel's UDP goes.
func (r Registration) Endpoint() netip.AddrPort {
	return netip.AddrPortFrom(r.ServerIP, uint16(r.ServerPort))
}

// AddKey registers pub with the WireGuard server s of region, with token,
// and checks every field of the answer.
func (a *API) AddKey(ctx context.Context, region string, s Server, port int, token Secret, pub wgtypes.Key) (Registration, error) {
	if err := serverOK("addKey", s); err != nil {
		return Registration{}, err
	}
	what := "addKey at " + s.CN
	q := url.Values{"pt": {token.Value()}, "pubkey": {pub.String()}}
	req, err := newRequest(ctx, what, http.MethodGet, "https://"+s.CN+"/addKey?"+q.Encode(), nil)
	if err != nil {
		return Registration{}, err
	}
	resp, err := a.server(s, port).Do(req)
	if err != nil {
		return Registration{}, fmt.Errorf("%s: %w", what, stripURL(err))
	}
	defer resp.Body.Close()
	var ans struct {
		Status     string   `json:"status"`
		Message    string   `json:"message"`
		ServerKey  string   `json:"server_key"`
		ServerPort int      `json:"server_port"`
		ServerIP   string   `json:"server_ip"`
		ServerVIP  string   `json:"server_vip"`
		PeerIP     string   `json:"peer_ip"`
		PeerPubkey string   `json:"peer_pubkey"`
		DNSServers []string `json:"dns_servers"`
	}
	if err := readJSON(what, resp, &ans); err != nil {
		if resp.StatusCode != http.StatusOK {
			return Registration{}, statusError(what, resp)
		}
		return Registration{}, err
	}
	// Judged by the body's status, never by the HTTP status alone: PIA
	// answers a bad token with 200.
	if ans.Status != "OK" {
		if strings.Contains(ans.Message, "Login failed") {
			return Registration{}, ErrLoginFailed
		}
		if resp.StatusCode != http.StatusOK {
			return Registration{}, statusError(what, resp)
		}
		return Registration{}, fmt.Errorf("%s: status %q", what, clip(ans.Status))
	}
	bad := func(field string) (Registration, error) {
		return Registration{}, fmt.Errorf("%s: the answer's %s is not valid", what, field)
	}
	if len(ans.DNSServers) > MaxDNSServers {
		return Registration{}, fmt.Errorf("%s: the answer's dns_servers lists %d resolvers, over the %d allowed", what, len(ans.DNSServers), MaxDNSServers)
	}
	r := Registration{Region: region, Server: s, ServerKey: ans.ServerKey, ServerPort: ans.ServerPort, PublicKey: pub.String(), At: time.Now().UTC()}
	for _, f := range []struct {
		name string
		s    string
		dst  *netip.Addr
	}{{"server_ip", ans.ServerIP, &r.ServerIP}, {"server_vip", ans.ServerVIP, &r.ServerVIP}, {"peer_ip", ans.PeerIP, &r.PeerIP}} {
		a, err := netip.ParseAddr(f.s)
		if err != nil || !a.Is4() {
			return bad(f.name)
		}
		*f.dst = a
	}
	if ans.PeerPubkey != pub.String() {
		return bad("peer_pubkey (not the key registered)")
	}
	for _, d := range ans.DNSServers {
		a, err := netip.ParseAddr(d)
		if err != nil || !a.Is4() {
			return bad("dns_servers")
		}
		r.DNS = append(r.DNS, a)
	}
	// Every field once more as a whole: no loopback, unspecified,
	// multicast, broadcast or link-local address, a 32-byte key, a port.
	if err := r.check(); err != nil {
		return Registration{}, fmt.Errorf("%s: the answer's %v", what, err)
	}
	return r, nil
}

// clip shortens what a server said for an error.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
