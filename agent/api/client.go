package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ErrUnreachable is wrapped by every error of a request that could not
// connect to the daemon's socket: the socket does not exist, nobody listens
// on it, or connecting was not permitted. Callers test it with errors.Is to
// tell "the daemon is not there" from "the daemon said no".
var ErrUnreachable = errors.New("nodeagent unreachable")

// DefaultTimeout bounds every request of a Client whose context carries no
// earlier deadline, so a wedged daemon cannot hang a caller that forgot one.
const DefaultTimeout = 10 * time.Second

// maxReply bounds how much of a reply is read. A status with thousands of
// peers is a few MiB; anything larger is not a reply from nodeagent.
const maxReply = 32 << 20

// HTTPError is a non-2xx reply from the daemon.
type HTTPError struct {
	// Code is the HTTP status code.
	Code int
	// Message is the daemon's explanation: the api.Error body, or the raw
	// body (or the status text) when the reply was not one.
	Message string
}

// Error returns the code, its text and the daemon's message, e.g.
// "403 Forbidden: reload needs root".
func (e *HTTPError) Error() string {
	text := fmt.Sprintf("%d %s", e.Code, http.StatusText(e.Code))
	if e.Message == "" {
		return text
	}
	return text + ": " + e.Message
}

// unreachableError is a failure to connect to the socket. Its text names the
// socket and the kernel's reason, without net.OpError's repetition of the
// path.
type unreachableError struct {
	socket string
	err    error
}

func (e *unreachableError) Error() string {
	reason := e.err
	var op *net.OpError
	if errors.As(e.err, &op) && op.Err != nil {
		reason = op.Err
	}
	return fmt.Sprintf("cannot reach nodeagent at %s: %v", e.socket, reason)
}

func (e *unreachableError) Unwrap() []error { return []error{ErrUnreachable, e.err} }

// Client talks to the daemon over its unix socket. It is safe for
// concurrent use.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the daemon listening on socket (usually
// DefaultSocket). It connects lazily, on the first request.
func NewClient(socket string) *Client {
	var d net.Dialer
	tr := &http.Transport{
		// The URL's host is a placeholder: every connection goes to the
		// socket, and no proxy from the environment is ever consulted (the
		// zero Proxy field means none).
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, "unix", socket)
			if err != nil {
				return nil, &unreachableError{socket: socket, err: err}
			}
			return conn, nil
		},
		MaxIdleConns:    1,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{
		socket: socket,
		http: &http.Client{
			Transport: tr,
			// The daemon never redirects; a redirect would come from
			// something else listening on the socket, so it is returned
			// as an HTTPError rather than followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// Socket returns the socket the client connects to.
func (c *Client) Socket() string { return c.socket }

// CloseIdleConnections closes the connections kept for reuse.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Status returns GET /v1/status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	if err := c.do(ctx, http.MethodGet, "/v1/status", &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Plan returns GET /v1/plan: what a sync would change now.
func (c *Client) Plan(ctx context.Context) (*Plan, error) {
	var p Plan
	if err := c.do(ctx, http.MethodGet, "/v1/plan", &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Reload asks the daemon to re-read its config (POST /v1/reload). A config
// that fails validation is not an error: it comes back with Applied false
// and the validation errors. The daemon allows it for root only and refuses
// anyone else with a 403 HTTPError.
func (c *Client) Reload(ctx context.Context) (*Reload, error) {
	var r Reload
	if err := c.do(ctx, http.MethodPost, "/v1/reload", &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// RetryPortHook asks, by POST /v1/port/retry, for the port hook of device
// (every PIA device's for "") to run now; root only.
func (c *Client) RetryPortHook(ctx context.Context, device string) (*PortRetry, error) {
	var r PortRetry
	path := "/v1/port/retry"
	if device != "" {
		path += "?" + url.Values{"device": {device}}.Encode()
	}
	if err := c.do(ctx, http.MethodPost, path, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Peers returns GET /v1/peers: every configured WireGuard device.
func (c *Client) Peers(ctx context.Context) ([]WireGuardDevice, error) {
	var devs []WireGuardDevice
	if err := c.do(ctx, http.MethodGet, "/v1/peers", &devs); err != nil {
		return nil, err
	}
	return devs, nil
}

// Healthz returns nil while the daemon's reconcile loop runs.
func (c *Client) Healthz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil)
}

// Readyz returns nil once the daemon's first full convergence is done and
// the node is not degraded; otherwise an HTTPError saying why.
func (c *Client) Readyz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", nil)
}

// do sends one request and decodes a 2xx reply's JSON into out (nil: the
// body is discarded).
func (c *Client) do(ctx context.Context, method, path string, out any) error {
	return c.send(ctx, method, path, nil, out)
}

// doJSON POSTs in as JSON to path and decodes the reply into out.
func (c *Client) doJSON(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	return c.send(ctx, http.MethodPost, path, body, out)
}

func (c *Client) send(ctx context.Context, method, path string, body []byte, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://nodeagent"+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var unreachable *unreachableError
		if errors.As(err, &unreachable) {
			return unreachable
		}
		// url.Error repeats the placeholder URL; the path is what matters.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return fmt.Errorf("%s %s: reading the reply: %w", method, path, err)
	}
	if len(reply) > maxReply {
		return fmt.Errorf("%s %s: reply larger than %d bytes", method, path, maxReply)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &HTTPError{Code: resp.StatusCode, Message: errorMessage(resp, reply)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(reply, out); err != nil {
		return fmt.Errorf("%s %s: decoding the reply: %w", method, path, err)
	}
	return nil
}

// errorMessage extracts the explanation of a non-2xx reply. The daemon sends
// an Error body; anything else (a proxy, an older daemon) is shown as text
// so the caller still learns something.
func errorMessage(resp *http.Response, body []byte) string {
	var e Error
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	if loc := resp.Header.Get("Location"); loc != "" && resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return "redirect to " + loc + " (not followed)"
	}
	text := strings.TrimSpace(string(bytes.ToValidUTF8(body, []byte("?"))))
	if len(text) > 512 {
		text = strings.ToValidUTF8(text[:512], "") + "…"
	}
	return text
}

// AddPeer asks for a client to be added (POST /v1/peers/add) and returns
// once the daemon has applied it. The daemon waits for its sync; give ctx
// a deadline of a minute or so.
func (c *Client) AddPeer(ctx context.Context, req PeerAdd) (*PeerAdded, error) {
	var r PeerAdded
	if err := c.doJSON(ctx, "/v1/peers/add", req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ChangePeer disables, enables or removes a client (action is one of
// those words) by POST /v1/peers/ACTION, and returns once the device is
// as asked.
func (c *Client) ChangePeer(ctx context.Context, action string, req PeerChange) (*PeerChanged, error) {
	var r PeerChanged
	if err := c.doJSON(ctx, "/v1/peers/"+url.PathEscape(action), req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
