// Package apiserver serves nodeagent's local API (see package api) over a
// unix socket.
//
// Access control is layered:
//
//   - The socket file gates who can connect at all: mode 0660, group
//     nodeagent (root only, 0600, when that group does not exist).
//   - Anyone who can connect may read, and add, disable, enable or remove
//     a remote-access client (POST /v1/peers/*: a register file of public
//     keys, what the group exists to manage). Other writes (POST
//     /v1/reload, /v1/port/retry) need the peer to be uid 0, taken from
//     the kernel (SO_PEERCRED) at accept time, not from anything the
//     client says.
//   - Requests that carry Origin, Referer or Sec-Fetch-* headers are
//     refused. Only browsers send those, and a browser must never be able to
//     drive the daemon, whether through a local TCP-to-unix proxy, DNS
//     rebinding or a CSRF-style form post.
package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"golang.org/x/sys/unix"
)

// Backend is what the server serves; the daemon implements it. Its methods
// are called concurrently, one call per request.
type Backend interface {
	// Status returns a consistent snapshot of the node's state.
	Status() api.Status
	// Plan returns what a sync would change now.
	Plan(ctx context.Context) api.Plan
	// Reload re-reads the config.
	Reload(ctx context.Context) api.Reload
	// Healthy reports whether the reconcile loop is alive.
	Healthy() bool
	// RetryPortHook runs a PIA device's port hook now (every device's
	// for "").
	RetryPortHook(ctx context.Context, device string) api.PortRetry
}

// PeerBackend is what the remote-access clients' endpoints ask of the
// backend, when it has them (the daemon does). Their errors may carry an
// HTTP status (an HTTPStatus() int method): 400 for a bad request, 404 for
// no such peer or device, 409 for a name in use or a full subnet.
type PeerBackend interface {
	// Peers returns the WireGuard devices with their figures read now.
	Peers(ctx context.Context) []api.WireGuardDevice
	AddPeer(ctx context.Context, req api.PeerAdd) (api.PeerAdded, error)
	// ChangePeer disables, enables or removes a peer (action).
	ChangePeer(ctx context.Context, action string, req api.PeerChange) (api.PeerChanged, error)
}

// DefaultGroup is the group whose members may read the API.
const DefaultGroup = "nodeagent"

// Options configures Listen.
type Options struct {
	// Socket is the socket's path; api.DefaultSocket when empty.
	Socket string
	// Group may connect to the socket; DefaultGroup when empty.
	Group string
	// Log receives warnings; none when nil.
	Log *slog.Logger
}

// Limits on what a client can make the server hold. The API's requests have
// no bodies and its clients are local tools, so these are generous for them
// and tight for anything else.
const (
	maxHeaderBytes    = 8 << 10
	maxBodyBytes      = 4 << 10
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	// writeTimeout bounds a whole response, including Backend.Plan and
	// Backend.Reload, which observe the kernel and may wait for the loop.
	writeTimeout = 2 * time.Minute
	// idleTimeout closes a kept-alive connection that sends nothing more:
	// nodeagentctl makes one request per connection, and an idle one holds
	// a slot.
	idleTimeout     = 5 * time.Second
	shutdownTimeout = 5 * time.Second
	dialTimeout     = time.Second
)

// Listen creates the API socket and returns its listener.
//
// An existing socket is replaced if nothing answers on it (a crashed
// daemon's leftover) and refused if something does (another daemon is
// running). The socket is bound in a private directory, given its mode and
// group there and then renamed into place, so it is never reachable with
// looser permissions, and a client never sees the path missing while a stale
// socket is being replaced. The parent directory is created 0750 (group
// Group) if it is missing.
//
// Closing the listener removes the socket file, unless another server has
// replaced it since.
func Listen(o Options) (net.Listener, error) {
	if o.Socket == "" {
		o.Socket = api.DefaultSocket
	}
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	path := o.Socket

	gid := -1
	if g, err := user.LookupGroup(o.Group); err != nil {
		log.Warn("API socket group not found; only root can use the API", "group", o.Group, "socket", path, "err", err)
	} else if gid, err = strconv.Atoi(g.Gid); err != nil {
		return nil, fmt.Errorf("group %s: gid %q: %w", o.Group, g.Gid, err)
	}

	dir := filepath.Dir(path)
	if err := makeDir(dir, gid); err != nil {
		return nil, err
	}
	if err := checkStale(path); err != nil {
		return nil, err
	}

	// The names are short because a unix socket path is limited to 107
	// bytes: dir/.NNNNNNNNNN/s is no longer than dir/nodeagent.sock, so
	// binding it works whenever the final path would. (The kernel keeps the
	// bind name as the server's address; clients' errors may show it.)
	tmp, err := os.MkdirTemp(dir, ".")
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	defer os.RemoveAll(tmp)
	tmpPath := filepath.Join(tmp, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmpPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	// The bound name is the temporary one; sockListener removes the real
	// path itself.
	l.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	mode := fs.FileMode(0o600)
	if gid >= 0 {
		mode = 0o660
		if err := os.Lchown(tmpPath, -1, gid); err != nil {
			return fail(err)
		}
	}
	if err := os.Chmod(tmpPath, mode); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmpPath, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return &sockListener{UnixListener: l, path: path, fi: fi}, nil
}

// makeDir creates dir 0750 with group gid (when known) if it is missing.
// An existing directory is left as it is: its owner (the package, or
// systemd's RuntimeDirectory=) decided its permissions.
func makeDir(dir string, gid int) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	// The group must be able to traverse the directory to reach the
	// socket; MkdirAll's mode is also subject to the umask.
	if gid >= 0 {
		if err := os.Lchown(dir, -1, gid); err != nil {
			return fmt.Errorf("socket directory %s: %w", dir, err)
		}
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	return nil
}

// checkStale returns nil when path is absent or a socket nobody listens on,
// which the rename in Listen then replaces.
func checkStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		// Never clobber a file that is not ours to remove.
		return fmt.Errorf("socket %s: exists and is not a socket (%s)", path, fi.Mode())
	}
	c, err := net.DialTimeout("unix", path, dialTimeout)
	if err == nil {
		c.Close()
		return fmt.Errorf("socket %s: another server is listening on it", path)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil // stale
	}
	return fmt.Errorf("socket %s: probing for a live server: %w", path, err)
}

// sockListener is the listener Listen returns: it removes its socket file
// on Close, and only while the file is still its own.
type sockListener struct {
	*net.UnixListener
	path string
	fi   fs.FileInfo
	once sync.Once
}

// Addr is the socket's final path, not the temporary one it was bound at.
func (l *sockListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *sockListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.fi) {
			if rerr := os.Remove(l.path); rerr != nil && err == nil {
				err = fmt.Errorf("socket %s: %w", l.path, rerr)
			}
		}
	})
	return err
}

// Serve serves b on l until ctx ends, then shuts down gracefully (in-flight
// requests get a few seconds) and closes l, which removes the socket file
// of a listener from Listen. It returns nil after a shutdown and the error
// otherwise.
func Serve(ctx context.Context, l net.Listener, b Backend, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &server{b: b, log: log}
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		// Requests in flight at shutdown get shutdownTimeout to finish
		// rather than having their context cancelled at once: a reload
		// half-done is worse than a stop delayed by a few seconds.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ConnContext: connContext,
	}
	addr := l.Addr().String()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(newLimitListener(l, log)) }()
	log.Info("serving the local API", "socket", addr)

	select {
	case err := <-errc:
		l.Close()
		return fmt.Errorf("API socket %s: %w", addr, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Warn("API shutdown timed out; closing open connections", "socket", addr, "err", err)
		srv.Close()
	}
	err := <-errc
	// Shutdown closed l already; closing again makes sure the socket file is
	// gone even if Serve failed before it got to l.
	l.Close()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("API socket %s: %w", addr, err)
	}
	return nil
}

// peer is the connecting process as the kernel saw it at connect time.
type peer struct {
	ok       bool // credentials were read
	uid, pid uint32
}

type peerKey struct{}

// connContext records the peer's credentials once per connection. They
// come from SO_PEERCRED, which the client cannot forge; anything it fails
// to read is treated as an unprivileged peer.
func connContext(ctx context.Context, c net.Conn) context.Context {
	var p peer
	if lc, ok := c.(*limitConn); ok {
		p = lc.peer
	} else {
		p = peerOf(c)
	}
	return context.WithValue(ctx, peerKey{}, p)
}

// peerOf reads c's SO_PEERCRED.
func peerOf(c net.Conn) peer {
	var p peer
	if uc, ok := c.(*net.UnixConn); ok {
		if raw, err := uc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
				if err == nil {
					p = peer{ok: true, uid: cred.Uid, pid: uint32(cred.Pid)}
				}
			})
		}
	}
	return p
}

func peerFrom(ctx context.Context) peer {
	p, _ := ctx.Value(peerKey{}).(peer)
	return p
}

type server struct {
	b   Backend
	log *slog.Logger
}

// route is one endpoint.
type route struct {
	method string
	root   bool // needs a uid 0 peer
	serve  func(*server, http.ResponseWriter, *http.Request)
}

// lookup returns the endpoint at path. A switch rather than a package-level
// map keeps the table immutable (DESIGN §10: no package-level mutable state).
func lookup(path string) (route, bool) {
	switch path {
	case "/v1/status":
		return route{method: http.MethodGet, serve: (*server).status}, true
	case "/v1/plan":
		return route{method: http.MethodGet, serve: (*server).plan}, true
	case "/v1/reload":
		return route{method: http.MethodPost, root: true, serve: (*server).reload}, true
	case "/v1/peers":
		return route{method: http.MethodGet, serve: (*server).peers}, true
	case "/v1/peers/add":
		return route{method: http.MethodPost, serve: (*server).peerAdd}, true
	case "/v1/peers/disable", "/v1/peers/enable", "/v1/peers/remove":
		return route{method: http.MethodPost, serve: (*server).peerChange}, true
	case "/v1/port/retry":
		return route{method: http.MethodPost, root: true, serve: (*server).portRetry}, true
	case "/healthz":
		return route{method: http.MethodGet, serve: (*server).healthz}, true
	case "/readyz":
		return route{method: http.MethodGet, serve: (*server).readyz}, true
	}
	return route{}, false
}

// browserHeader returns the first header of h that only browsers send, or
// "". A request carrying one came from, or through, a web page; nodeagentctl
// and curl send none unless told to. Sec-Fetch-* matters for GETs from <img>
// or <script> with referrerpolicy=no-referrer, which carry neither Origin
// nor Referer.
func browserHeader(h http.Header) string {
	for _, name := range [...]string{"Origin", "Referer", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest", "Sec-Fetch-User"} {
		if _, ok := h[name]; ok {
			return name
		}
	}
	return ""
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w}
	s.serve(rec, r)
	p := peerFrom(r.Context())
	s.log.Debug("API request", "method", r.Method, "path", r.URL.Path, "status", rec.code,
		"duration", time.Since(start), "peer_uid", p.uid, "peer_pid", p.pid, "peer_known", p.ok)
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if h := browserHeader(r.Header); h != "" {
		writeError(w, http.StatusForbidden, fmt.Sprintf("requests with a %s header are refused: the API is not for browsers", h))
		return
	}
	if r.ContentLength > maxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)

	rt, ok := lookup(r.URL.Path)
	if !ok {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
		return
	}
	allowed := []string{rt.method}
	if rt.method == http.MethodGet {
		allowed = append(allowed, http.MethodHead)
	}
	if !slices.Contains(allowed, r.Method) {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: method not allowed (use %s)", r.Method, r.URL.Path, rt.method))
		return
	}
	if rt.root {
		if p := peerFrom(r.Context()); !p.ok || p.uid != 0 {
			writeError(w, http.StatusForbidden, strings.TrimPrefix(r.URL.Path, "/v1/")+" needs root")
			return
		}
	}
	rt.serve(s, w, r)
}

func (s *server) status(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.b.Status())
}

func (s *server) plan(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.b.Plan(r.Context()))
}

func (s *server) reload(w http.ResponseWriter, r *http.Request) {
	p := peerFrom(r.Context())
	res := s.b.Reload(r.Context())
	// A reload changes state: log it at info, with who asked.
	s.log.Info("config reload requested over the API", "peer_pid", p.pid, "applied", res.Applied, "config_hash", res.ConfigHash)
	// A rejected config is still a successful call: Reload says why.
	writeJSON(w, http.StatusOK, res)
}

// portRetry runs a port hook now: ?device=NAME, or every device's.
func (s *server) portRetry(w http.ResponseWriter, r *http.Request) {
	dev := r.URL.Query().Get("device")
	if len(dev) > 15 || strings.ContainsFunc(dev, func(c rune) bool { return c <= ' ' || c == '/' || c > '~' }) {
		writeError(w, http.StatusBadRequest, "device: not an interface name")
		return
	}
	p := peerFrom(r.Context())
	res := s.b.RetryPortHook(r.Context(), dev)
	s.log.Info("port hook retry requested over the API", "peer_pid", p.pid, "device", dev, "retried", strings.Join(res.Devices, ","), "error", res.Error)
	code := http.StatusOK
	if res.Error != "" && len(res.Devices) == 0 {
		code = http.StatusConflict
	}
	writeJSON(w, code, res)
}

func (s *server) peers(w http.ResponseWriter, r *http.Request) {
	var devs []api.WireGuardDevice
	if pb, ok := s.b.(PeerBackend); ok {
		devs = pb.Peers(r.Context())
	} else {
		devs = s.b.Status().WireGuard
	}
	if devs == nil {
		devs = []api.WireGuardDevice{} // [] rather than null for clients
	}
	writeJSON(w, http.StatusOK, devs)
}

// peerAdd adds a remote-access client: for root and the socket's group,
// whose members can connect at all (the socket is theirs alone).
func (s *server) peerAdd(w http.ResponseWriter, r *http.Request) {
	pb, ok := s.b.(PeerBackend)
	if !ok {
		writeError(w, http.StatusNotImplemented, "this daemon does not add peers")
		return
	}
	var req api.PeerAdd
	if !decodeBody(w, r, &req) {
		return
	}
	p := peerFrom(r.Context())
	res, err := pb.AddPeer(r.Context(), req)
	if err != nil {
		s.log.Info("peer add refused", "peer_uid", p.uid, "peer_pid", p.pid, "name", clip(req.Name), "err", err)
		writeError(w, httpStatus(err), err.Error())
		return
	}
	// A change of the register: logged at info with who asked (never a
	// key).
	s.log.Info("peer added over the API", "peer_uid", p.uid, "peer_pid", p.pid, "device", res.Device, "name", res.Name,
		"file", res.File, "addresses", strings.Join(res.Addresses, ","))
	writeJSON(w, http.StatusOK, res)
}

// peerChange disables, enables or removes a remote-access client.
func (s *server) peerChange(w http.ResponseWriter, r *http.Request) {
	pb, ok := s.b.(PeerBackend)
	if !ok {
		writeError(w, http.StatusNotImplemented, "this daemon does not change peers")
		return
	}
	var req api.PeerChange
	if !decodeBody(w, r, &req) {
		return
	}
	action := strings.TrimPrefix(r.URL.Path, "/v1/peers/")
	p := peerFrom(r.Context())
	res, err := pb.ChangePeer(r.Context(), action, req)
	if err != nil {
		s.log.Info("peer "+action+" refused", "peer_uid", p.uid, "peer_pid", p.pid, "name", clip(req.Name), "err", err)
		writeError(w, httpStatus(err), err.Error())
		return
	}
	s.log.Info("peer "+action+" over the API", "peer_uid", p.uid, "peer_pid", p.pid, "device", res.Device, "name", res.Name, "file", res.File, "changed", res.Changed)
	writeJSON(w, http.StatusOK, res)
}

// decodeBody reads r's JSON body into v (unknown fields refused), or
// answers 400 and reports false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		msg := "the body is not the JSON this endpoint takes"
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			msg = "request body too large"
		}
		writeError(w, http.StatusBadRequest, msg)
		return false
	}
	return true
}

// httpStatus is err's HTTP status, 500 when it names none.
func httpStatus(err error) int {
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) {
		return hs.HTTPStatus()
	}
	return http.StatusInternalServerError
}

// clip bounds a client-given string in a log line.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	if !s.b.Healthy() {
		writeError(w, http.StatusServiceUnavailable, "the reconcile loop is not running")
		return
	}
	writeText(w, "ok\n")
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	st := s.b.Status()
	if st.Ready && !st.Degraded {
		writeText(w, "ok\n")
		return
	}
	writeError(w, http.StatusServiceUnavailable, notReadyReason(&st))
}

// notReadyReason names what keeps the node from being ready: "not ready"
// and/or "degraded", then every condition that is not True, e.g.
// "degraded: KillSwitchArmed=False (TableMissing: nodeagent-ks absent)".
func notReadyReason(st *api.Status) string {
	var what []string
	if !st.Ready {
		what = append(what, "not ready")
	}
	if st.Degraded {
		what = append(what, "degraded")
	}
	var conds []string
	for _, c := range st.Conditions {
		if c.Status == api.True {
			continue
		}
		s := c.Type + "=" + c.Status
		switch {
		case c.Reason != "" && c.Message != "":
			s += " (" + c.Reason + ": " + c.Message + ")"
		case c.Reason != "":
			s += " (" + c.Reason + ")"
		case c.Message != "":
			s += " (" + c.Message + ")"
		}
		conds = append(conds, s)
	}
	msg := strings.Join(what, ", ")
	if len(conds) > 0 {
		msg += ": " + strings.Join(conds, "; ")
	}
	return msg
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// The API types always marshal; this is a bug, say so plainly.
		code = http.StatusInternalServerError
		body, _ = json.Marshal(api.Error{Error: "encoding the response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, api.Error{Error: msg})
}

func writeText(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(s))
}

// statusRecorder remembers the status code for the request log.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Connection limits, by the peer's uid (SO_PEERCRED, read at accept):
// anyone in the socket's group could otherwise open connections until the
// daemon runs out of file descriptors (it needs them for netlink and
// nftables), or hold every slot idle and lock root out of status, reload
// and wait. Root has slots of its own that no other uid can take.
const (
	maxConnsPerUID = 8  // one non-root uid
	maxUserConns   = 32 // all non-root uids together
	maxRootConns   = 16 // uid 0, on top of maxUserConns
	// rejectTimeout bounds writing the 503 to a connection over its limit.
	rejectTimeout = 100 * time.Millisecond
)

// limitListener enforces those limits. A connection over its limit is
// answered 503 and closed at once, so that it never waits in the backlog
// in front of root's.
type limitListener struct {
	net.Listener
	log *slog.Logger

	// mu guards the counts.
	mu     sync.Mutex
	byUID  map[uint32]int
	users  int
	root   int
	logged time.Time // the last "over the limit" log line, to rate-limit it
}

func newLimitListener(l net.Listener, log *slog.Logger) *limitListener {
	return &limitListener{Listener: l, log: log, byUID: map[uint32]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p := peerOf(c)
		if l.take(p) {
			return &limitConn{Conn: c, peer: p, release: func() { l.release(p) }}, nil
		}
		l.reject(c, p)
	}
}

// take counts a connection from p, or reports that p is at its limit. A
// peer whose credentials could not be read counts as an unprivileged uid
// of its own (the nobody uid).
func (l *limitListener) take(p peer) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.ok && p.uid == 0 {
		if l.root >= maxRootConns {
			return false
		}
		l.root++
		return true
	}
	uid := p.key()
	if l.users >= maxUserConns || l.byUID[uid] >= maxConnsPerUID {
		return false
	}
	l.users++
	l.byUID[uid]++
	return true
}

func (l *limitListener) release(p peer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.ok && p.uid == 0 {
		l.root--
		return
	}
	uid := p.key()
	l.users--
	if l.byUID[uid]--; l.byUID[uid] <= 0 {
		delete(l.byUID, uid)
	}
}

// reject answers a connection over its limit with a 503 that names the
// limit, without reading its request, and closes it.
func (l *limitListener) reject(c net.Conn, p peer) {
	l.mu.Lock()
	logIt := time.Since(l.logged) > 10*time.Second
	if logIt {
		l.logged = time.Now()
	}
	l.mu.Unlock()
	if logIt {
		l.log.Warn("local API: connection over its limit refused", "peer_uid", p.uid, "peer_pid", p.pid, "peer_known", p.ok,
			"per_uid", maxConnsPerUID, "all_users", maxUserConns)
	}
	body := fmt.Sprintf(`{"error":"too many connections (at most %d per user, %d for all users but root); try again"}`+"\n", maxConnsPerUID, maxUserConns)
	c.SetWriteDeadline(time.Now().Add(rejectTimeout))
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s", len(body), body)
	c.Close()
}

// key is the uid a peer counts under.
func (p peer) key() uint32 {
	if !p.ok {
		return 65534
	}
	return p.uid
}

type limitConn struct {
	net.Conn
	peer    peer
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
