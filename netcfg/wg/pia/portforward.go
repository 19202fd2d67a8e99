package pia

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"time"
)

// Port forwarding (PIA.md §4): both calls go to https://<server_vip>:19999
// through the tunnel, pinned to PIA's root and the server's cn.

// PFPort is the port-forwarding API's port.
const PFPort = 19999

// Signature is a port-forwarding signature: the payload and signature
// kept verbatim (re-encoding may break it), and what the payload says.
type Signature struct {
	Payload   Secret
	Signature Secret
	Port      int
	// Expires is when the payload stops being good; zero when PIA did not
	// say (then it is renewed when a bind fails).
	Expires time.Time
	// Server is the cn of the server it was issued by: it binds there only.
	Server string
	At     time.Time
}

// ErrPortBusy is bindPort's 409: the port is taken on this server; use
// another server.
var ErrPortBusy = errors.New("bindPort: the port is busy on this server (HTTP 409); moving to another server")

func (a *API) pf(dial DialFunc, cn string, vip netip.Addr) *http.Client {
	return httpClient(pinned(a.Roots, cn, a.now), dial, netip.AddrPortFrom(vip, PFPort).String(), apiTimeout, a.budget)
}

// maxSigField bounds a payload and a signature (PIA's are a few hundred
// bytes): they are saved, and the state file has a size cap.
const maxSigField = 2048

// pfOK checks the server's cn and vip before anything is sent.
func pfOK(what, cn string, vip netip.Addr) error {
	if !ValidCN(cn) {
		return fmt.Errorf("%s: the server's cn is not a host name; not asked", what)
	}
	if why := unicast4(vip); why != "" {
		return fmt.Errorf("%s: server_vip is not valid (%s); not asked", what, why)
	}
	return nil
}

// GetSignature asks the server cn (at vip, through the tunnel) for a
// port-forwarding signature for token.
func (a *API) GetSignature(ctx context.Context, dial DialFunc, cn string, vip netip.Addr, token Secret) (Signature, error) {
	if err := pfOK("getSignature", cn, vip); err != nil {
		return Signature{}, err
	}
	what := "getSignature at " + cn
	req, err := newRequest(ctx, what, http.MethodGet, "https://"+cn+":"+strconv.Itoa(PFPort)+"/getSignature?"+url.Values{"token": {token.Value()}}.Encode(), nil)
	if err != nil {
		return Signature{}, err
	}
	resp, err := a.pf(dial, cn, vip).Do(req)
	if err != nil {
		return Signature{}, fmt.Errorf("%s: %w", what, stripURL(err))
	}
	defer resp.Body.Close()
	var ans struct {
		Status    string `json:"status"`
		Payload   string `json:"payload"`
		Signature string `json:"signature"`
	}
	if err := readJSON(what, resp, &ans); err != nil || ans.Status != "OK" {
		if resp.StatusCode != http.StatusOK {
			return Signature{}, statusError(what, resp)
		}
		if err == nil {
			err = fmt.Errorf("%s: status %q", what, clip(ans.Status))
		}
		return Signature{}, err
	}
	raw, err := base64.StdEncoding.DecodeString(ans.Payload)
	if err != nil || ans.Signature == "" || len(ans.Payload) > maxSigField || len(ans.Signature) > maxSigField {
		return Signature{}, fmt.Errorf("%s: the answer's payload or signature is not valid", what)
	}
	var p struct {
		Port      int    `json:"port"`
		ExpiresAt string `json:"expires_at"`
	}
	if err := json.Unmarshal(raw, &p); err != nil || p.Port < 1 || p.Port > 65535 {
		return Signature{}, fmt.Errorf("%s: the payload holds no valid port", what)
	}
	s := Signature{Payload: Secret(ans.Payload), Signature: Secret(ans.Signature), Port: p.Port, Server: cn, At: time.Now().UTC()}
	if p.ExpiresAt != "" {
		// Tolerated when missing (PIA's own README shows created_at);
		// renewed on a bind failure then.
		if t, err := time.Parse(time.RFC3339Nano, p.ExpiresAt); err == nil {
			s.Expires = t
		}
	}
	return s, nil
}

// BindPort binds s's port at the server cn (at vip, through the tunnel).
func (a *API) BindPort(ctx context.Context, dial DialFunc, cn string, vip netip.Addr, s Signature) error {
	if err := pfOK("bindPort", cn, vip); err != nil {
		return err
	}
	what := "bindPort at " + cn
	q := url.Values{"payload": {s.Payload.Value()}, "signature": {s.Signature.Value()}}
	req, err := newRequest(ctx, what, http.MethodGet, "https://"+cn+":"+strconv.Itoa(PFPort)+"/bindPort?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := a.pf(dial, cn, vip).Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, stripURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusConflict {
		return ErrPortBusy
	}
	var ans struct {
		Status string `json:"status"`
	}
	if err := readJSON(what, resp, &ans); err != nil || ans.Status != "OK" {
		if resp.StatusCode != http.StatusOK {
			return statusError(what, resp)
		}
		if err == nil {
			err = fmt.Errorf("%s: status %q", what, clip(ans.Status))
		}
		return err
	}
	return nil
}

type (
	sigResult struct {
		s   Signature
		err error
	}
	bindResult struct {
		s   *Signature
		err error
	}
	dnsResult struct{ active netip.Addr }
)

// stepPF starts port forwarding's next call when one is due: a signature
// when there is none for the registration's server (or it is close to
// its end), else a bind.
func (p *Provider) stepPF(ctx context.Context, now time.Time) {
	if p.pfBusy || now.Before(p.pfAt) {
		return
	}
	if free := p.budget.free(now); free.After(now) {
		p.pfAt = free
		return
	}
	p.pfBusy = true
	api, cn, vip, dial := p.cfg.API, p.reg.Server.CN, p.reg.ServerVIP, p.cfg.Host.DialDevice(p.cfg.Device)
	// Renewed when close to its end, but not more often than it is bound:
	// a server handing out short payloads must not get a signature storm.
	if s := p.sig; s == nil || s.Server != cn || !s.Expires.IsZero() && s.Expires.Sub(now) < p.t.RenewBefore && now.Sub(s.At) >= p.t.BindEvery {
		tok := p.token
		p.run(ctx, callPF, 0, callTimeout, func(ctx context.Context) any {
			s, err := api.GetSignature(ctx, dial, cn, vip, tok)
			return sigResult{s, err}
		})
		return
	}
	sig := p.sig
	p.run(ctx, callPF, 0, callTimeout, func(ctx context.Context) any {
		return bindResult{sig, api.BindPort(ctx, dial, cn, vip, *sig)}
	})
}

// handlePF takes a port-forwarding call's result; it reports whether the
// desired state changed (a new port to forward, or a server to leave).
func (p *Provider) handlePF(res any) bool {
	now := p.now()
	var err error
	switch r := res.(type) {
	case sigResult:
		err = r.err
	case bindResult:
		err = r.err
	}
	if be, ok := budgetOf(err); ok {
		// Not sent: tried again once the budget has room, and no failure
		// (a bind refused so keeps its one retry with a new signature).
		p.pfAt = be.Until
		return false
	}
	if err != nil && p.pfTrouble.IsZero() && p.port != 0 {
		// The trouble of a port bound before starts here; saved, so a
		// restart does not start its clock again.
		p.pfTrouble = now
		defer p.save()
	}
	switch r := res.(type) {
	case sigResult:
		if r.err != nil {
			p.pfFail(now, r.err.Error())
			return false
		}
		s := r.s
		p.sig, p.pfAt = &s, now
		p.log.Info("port forwarding: signature issued", "server", s.Server, "port", s.Port, "expires", s.Expires)
		p.save()
	case bindResult:
		if r.s != p.sig {
			return false // replaced meanwhile
		}
		switch {
		case r.err == nil:
			p.bound, p.pfErr, p.pfN, p.pfTried, p.pfTrouble = now, "", 0, false, time.Time{}
			p.pfAt = now.Add(p.t.BindEvery)
			// Saved at every bind: the last good bind is what a restart
			// judges a port lost by.
			defer p.save()
			if p.port != r.s.Port {
				p.log.Info("port forwarding: port bound", "port", r.s.Port, "was", p.port, "server", r.s.Server)
				p.port = r.s.Port
				return true
			}
		case errors.Is(r.err, ErrPortBusy):
			p.pfErr = r.err.Error()
			p.sig = nil
			p.log.Warn("port forwarding: "+r.err.Error(), "server", r.s.Server)
			p.leaveServer(now, r.err.Error())
			return true
		case !p.pfTried:
			// One new signature, and a retry after BindRetry.
			p.pfTried, p.sig = true, nil
			p.pfErr = r.err.Error()
			p.pfAt = now.Add(p.t.BindRetry)
			p.log.Warn("port forwarding: bind failed; getting a new signature", "err", r.err)
		default:
			p.pfFail(now, r.err.Error())
		}
	}
	return false
}

// pfFail notes a failed port-forwarding call and backs off.
func (p *Provider) pfFail(now time.Time, msg string) {
	if p.pfErr != msg {
		p.log.Warn("port forwarding: "+msg, "server", p.reg.Server.CN)
	}
	p.pfErr = msg
	p.pfN++
	d := p.t.BindRetry
	for i := 1; i < p.pfN && d < p.t.BackoffMax; i++ {
		d *= 2
	}
	p.pfAt = now.Add(min(d, p.t.BackoffMax))
}

// leaveServer gives up the current server at once (a port busy there):
// the region's next one is registered with.
func (p *Provider) leaveServer(now time.Time, reason string) {
	if s, ok := p.server(); ok {
		p.fails[s.CN] = p.t.ServerFailures - 1
	}
	p.fail(now, reason, true)
}

// Port is the forwarded port, 0 before one was bound. It stays the last
// bound port while a new one is sought, so the DNAT moves in one step.
func (p *Provider) Port() int { return p.port }

// PortTroubleSince is when the forwarded port stopped being kept bound:
// the earliest of the first failed port-forwarding call since the last
// good bind, the moment the tunnel went unhealthy (binds wait for it;
// not before the last good bind), and the time the next bind was due and
// none was good (a daemon that was stopped, a budget that held binds
// back). Zero while the port is kept, or without a port. How long the
// trouble may last before the port counts as lost is the caller's.
func (p *Provider) PortTroubleSince(now time.Time) time.Time {
	if p.port == 0 {
		return time.Time{}
	}
	var t time.Time
	earliest := func(x time.Time) {
		if !x.IsZero() && (t.IsZero() || x.Before(t)) {
			t = x
		}
	}
	earliest(p.pfTrouble)
	if !p.healthy && !p.sickSince.IsZero() {
		earliest(later(p.sickSince, p.bound))
	}
	if !p.bound.IsZero() {
		if due := p.bound.Add(p.t.BindEvery); now.After(due) {
			earliest(due)
		}
	}
	return t
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// noteHealth keeps sickSince: when the tunnel was last seen going
// unhealthy.
func (p *Provider) noteHealth(now time.Time) {
	switch {
	case p.healthy:
		p.sickSince = time.Time{}
	case p.sickSince.IsZero():
		p.sickSince = now
	}
}

// Notified is the port onChange last ran for.
func (p *Provider) Notified() int { return p.notified }

// SetNotified records that onChange ran (or failed) for port: it is not
// run again for it, even after a restart.
func (p *Provider) SetNotified(port int) {
	if p.notified != port {
		p.notified = port
		p.save()
	}
}

// DefaultDNS is the resolver DNS goes to before a registration says
// otherwise (PIA.md §3's usual first dns_servers entry): queries then
// go into the tunnel, or are dropped by the kill switch, never to the
// node's own resolver.
var DefaultDNS = netip.MustParseAddr("10.0.0.243")

// DNS is the resolver the DNS redirect sends to: the first of addKey's
// dns_servers that answered a probe through the tunnel; until one has,
// DefaultDNS. An answer's dns_servers are never used unprobed: what a
// server names is not trusted to be a resolver inside its tunnel (it may
// name an address of the node's, or of its LAN). DefaultDNS is fail-closed
// on its own: it is PIA's resolver, inside PIA's network, so the
// redirected queries are routed by the kill-switch table into the tunnel,
// or dropped by the kill switch while there is none; they reach no other
// resolver.
func (p *Provider) DNS() netip.Addr {
	if p.dnsActive.IsValid() {
		return p.dnsActive
	}
	return DefaultDNS
}

// stepDNS probes the registration's resolvers, in order, when due.
func (p *Provider) stepDNS(ctx context.Context, now time.Time) {
	if p.dnsBusy || now.Before(p.dnsAt) || p.reg == nil || len(p.reg.DNS) == 0 {
		return
	}
	p.dnsBusy, p.dnsAt = true, now.Add(p.t.DNSEvery)
	h, dev, servers := p.cfg.Host, p.cfg.Device, p.reg.DNS
	p.run(ctx, callDNS, 0, 10*time.Second, func(context.Context) any {
		for _, s := range servers {
			if ProbeDNS(h, dev, s, 2*time.Second) == nil {
				return dnsResult{s}
			}
		}
		return dnsResult{}
	})
}

func (p *Provider) handleDNS(r dnsResult) bool {
	if !r.active.IsValid() {
		p.log.Warn("none of PIA's resolvers answered; DNS stays where it was", "resolvers", fmt.Sprint(p.reg.DNS), "dns", p.DNS())
		p.dnsAt = p.now().Add(30 * time.Second)
		return false
	}
	if r.active == p.dnsActive {
		return false
	}
	if p.dnsActive.IsValid() || r.active != p.DNS() {
		p.log.Info("DNS resolver", "now", r.active, "was", p.DNS())
	}
	changed := r.active != p.DNS()
	p.dnsActive = r.active
	return changed
}
