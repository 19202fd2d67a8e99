package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeagent/nodeagent/agent/api"
)

// idle is how long Run sleeps with nothing scheduled; Update and SetConfig
// wake it sooner.
const idle = time.Hour

// requestTimeout bounds one API request, so a black-holed API server does
// not hold the Labeler for the kernel's TCP timeout.
const requestTimeout = 15 * time.Second

// runState is Run's own state; only Run's goroutine touches it.
type runState struct {
	// failures counts the failed attempts in a row; retryAt is when the
	// next may start.
	failures int
	retryAt  time.Time
	// synced reports whether applied is on the Node (conflicting keys
	// aside), since appliedAt; dueAt is when it is applied again anyway.
	synced    bool
	applied   desired
	appliedAt time.Time
	dueAt     time.Time
	// wasOn reports whether this Labeler has applied for an enabled
	// config, so a disabled one must still remove what it applied.
	wasOn bool
}

// Run keeps the Node converged until ctx is done. It waits for the first
// Update, so a restarted agent does not strip the annotations before the
// daemon has observed anything, then applies on every change, after a
// failure with a backoff, and every Resync.
func (l *Labeler) Run(ctx context.Context) {
	var r runState
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-timer.C:
		}
		timer.Reset(l.step(ctx, &r))
	}
}

// step applies if anything is due and returns how long to sleep.
func (l *Labeler) step(ctx context.Context, r *runState) time.Duration {
	now := l.now()
	l.mu.Lock()
	cfg, hasSnap := l.cfg, l.hasSnap
	if l.cfgChanged {
		// A reload may have fixed the cause of a failure: try at once.
		l.cfgChanged = false
		r.failures, r.retryAt, r.synced = 0, time.Time{}, false
	}
	l.mu.Unlock()

	switch {
	case !cfg.Enabled && !r.wasOn:
		l.mu.Lock()
		if l.cond.Reason != ReasonDisabled {
			l.cond = disabledCondition(now)
		}
		l.mu.Unlock()
		return idle
	case cfg.Enabled && !hasSnap:
		l.setCondition(api.False, ReasonPending, fmt.Sprintf("node %s: waiting for the first sync", cfg.NodeName))
		return idle
	case now.Before(r.retryAt):
		return r.retryAt.Sub(now)
	}

	want, next := l.want(now, cfg)
	if r.synced && now.Before(r.dueAt) && !l.needsInit() {
		wait := r.dueAt.Sub(now)
		if !next.IsZero() {
			wait = min(wait, next.Sub(now))
		}
		switch {
		case !maps.Equal(want.Labels, r.applied.Labels):
			// A label changed: apply now.
		case !maps.Equal(want.Annotations, r.applied.Annotations):
			// Only annotations changed: at most one write per hold.
			if until := r.appliedAt.Add(cfg.Hold).Sub(now); until > 0 {
				return min(wait, until)
			}
		default:
			return wait
		}
	}

	res, err := l.sync(ctx, cfg)
	if ctx.Err() != nil {
		return idle
	}
	now = l.now()
	if err != nil {
		r.synced = false
		r.failures++
		d := backoff(cfg, r.failures)
		r.retryAt = now.Add(d)
		reason := reasonFor(err)
		if reason == ReasonNoCredentials || reason == ReasonUnauthorized {
			// Credentials may be rewritten (k3s at first boot, a rotated
			// certificate): read them again next time.
			l.client = nil
		}
		l.setCondition(api.False, reason, fmt.Sprintf("%v%s; retry %d in %s", err, httpCode(err), r.failures, d.Round(time.Millisecond)))
		return d
	}
	r.failures, r.retryAt = 0, time.Time{}
	r.synced, r.applied, r.appliedAt = true, res.want, now
	r.dueAt = now.Add(cfg.resync())
	if len(res.conflicts) > 0 {
		// Retry sooner than a resync: the other manager may let go.
		r.dueAt = now.Add(cfg.maxBackoff())
		l.setCondition(api.False, ReasonConflict, fmt.Sprintf("node %s: %s; left as they are, the rest is applied",
			cfg.NodeName, strings.Join(res.conflicts, "; ")))
	} else if cfg.Enabled {
		l.setCondition(api.True, ReasonSynced, fmt.Sprintf("node %s: %d labels, %d annotations", cfg.NodeName, len(res.want.Labels), len(res.want.Annotations)))
	}
	if cfg.Enabled {
		r.wasOn = true
	} else {
		// Everything nodeagent applied is removed; nothing more to do.
		r.wasOn = false
		l.mu.Lock()
		l.cond = disabledCondition(now)
		l.mu.Unlock()
		return idle
	}
	_, next = l.want(now, cfg)
	wait := r.dueAt.Sub(now)
	if !next.IsZero() {
		wait = min(wait, next.Sub(now))
	}
	return wait
}

// want settles the hysteresis at now and returns the desired state and
// when the next conditional label change is due (zero if none).
func (l *Labeler) want(now time.Time, cfg Config) (desired, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := l.hyst.settle(now, cfg.Hold)
	return desiredState(cfg, l.snap, l.hyst), next
}

func (l *Labeler) needsInit() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hyst.needsInit()
}

// syncResult is what one successful sync applied.
type syncResult struct {
	// want is the desired state applied, conflicting keys included (they
	// are retried, not forgotten).
	want desired
	// conflicts describe the keys another manager owns.
	conflicts []string
}

// sync reads the Node, learns which labels nodeagent owns on it, takes
// over the adopted labels another manager owns, and applies the desired
// state, leaving out the other keys another manager owns.
func (l *Labeler) sync(ctx context.Context, cfg Config) (syncResult, error) {
	c, err := l.clientFor(cfg)
	if err != nil {
		return syncResult{}, err
	}
	// Apply creates a missing object, and a node identity may create its
	// own Node; a Node with only nodeagent's labels would confuse the
	// kubelet's registration, so the Node must exist first. (The kubelet
	// never deletes its Node, so the race with Apply is harmless.)
	node, err := c.GetNode(ctx, cfg.NodeName)
	if err != nil {
		return syncResult{}, fmt.Errorf("get node %s: %w", cfg.NodeName, err)
	}
	ownedLabels, _ := owned(node.ManagedFields, FieldManager)
	l.mu.Lock()
	l.hyst.init(ownedLabels)
	l.mu.Unlock()
	want, _ := l.want(l.now(), cfg)

	// Adopted labels become nodeagent's alone before the apply, so the
	// apply sets their value without a conflict. A failed take-over does
	// not hold back the rest: the apply still runs (the key conflicts or
	// stays shared, as without adoption), then the sync fails into the
	// backoff and the next one reads the Node and tries again.
	var adoptErr error
	if keys := takeovers(node, want.Labels, cfg.Adopt); len(keys) > 0 {
		if err := l.adopt(ctx, c, node, keys); err != nil {
			adoptErr = fmt.Errorf("adopt label %s on node %s: %w", strings.Join(keys, ", "), cfg.NodeName, err)
		}
	}

	res := syncResult{want: want}
	apply := desired{Labels: maps.Clone(want.Labels), Annotations: maps.Clone(want.Annotations)}
	// Each retry drops the keys the server named; three rounds cover a
	// second manager taking a key between two applies.
	for range 3 {
		err = c.ApplyNode(ctx, cfg.NodeName, apply.Labels, apply.Annotations)
		if err == nil && adoptErr != nil {
			return syncResult{}, adoptErr
		}
		if err == nil {
			return res, nil
		}
		cs := conflicts(err)
		if len(cs) == 0 {
			break
		}
		for _, c := range cs {
			if c.label {
				delete(apply.Labels, c.key)
			} else {
				delete(apply.Annotations, c.key)
			}
			res.conflicts = append(res.conflicts, c.String())
		}
	}
	return syncResult{}, fmt.Errorf("label node %s: %w", cfg.NodeName, err)
}

// clientFor returns the API client for cfg, building it when the
// credentials changed.
func (l *Labeler) clientFor(cfg Config) (*nodeClient, error) {
	if l.client != nil && l.clientKey == cfg.clientKey() {
		return l.client, nil
	}
	c, err := l.newClient(cfg)
	if err != nil {
		l.client = nil
		return nil, &credentialsError{err: err}
	}
	l.client, l.clientKey = c, cfg.clientKey()
	return c, nil
}

// credentialsError is a failure to build a client from the credentials.
type credentialsError struct{ err error }

func (e *credentialsError) Error() string { return "credentials: " + e.err.Error() }
func (e *credentialsError) Unwrap() error { return e.err }

// newClient builds a client from cfg's credentials.
func newClient(cfg Config) (*nodeClient, error) {
	rc, err := RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	if rc.Timeout == 0 {
		rc.Timeout = requestTimeout
	}
	return newNodeClient(rc)
}

// MaxResponseBytes bounds what the labeler reads of one API response. The
// agent reads only its own Node, a few KiB (tens with many images); an API
// server, or something posing as one, that sends more is refused rather
// than let grow the daemon's memory without limit.
const MaxResponseBytes = 8 << 20

// capBodies is a transport that caps every response body at
// MaxResponseBytes: a read past the cap fails.
type capBodies struct{ rt http.RoundTripper }

func (c capBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > MaxResponseBytes {
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: response of %d bytes refused (at most %d)", req.Method, req.URL.Path, resp.ContentLength, MaxResponseBytes)
	}
	resp.Body = &cappedBody{ReadCloser: resp.Body, left: MaxResponseBytes}
	return resp, nil
}

type cappedBody struct {
	io.ReadCloser
	left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("response body larger than %d bytes refused", MaxResponseBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left+1] // one byte more tells a body that is exactly the cap from a bigger one
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n, fmt.Errorf("response body larger than %d bytes refused", MaxResponseBytes)
	}
	return n, err
}

// backoff is the delay after n failures in a row: MinBackoff doubling up
// to MaxBackoff, plus up to 10% so a cluster's agents do not retry in
// lockstep when the API server comes back.
func backoff(cfg Config, n int) time.Duration {
	d, maxD := cfg.minBackoff(), cfg.maxBackoff()
	for i := 1; i < n && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	return d + rand.N(d/10+1)
}

// reasonFor is the LabelsSynced reason for a failed sync.
func reasonFor(err error) string {
	var ce *credentialsError
	switch {
	case errors.As(err, &ce):
		return ReasonNoCredentials
	case apierrors.IsForbidden(err):
		return ReasonForbidden
	case apierrors.IsUnauthorized(err):
		return ReasonUnauthorized
	case apierrors.IsNotFound(err):
		return ReasonNodeNotFound
	case apierrors.IsConflict(err):
		return ReasonConflict
	case apierrors.IsInvalid(err):
		return ReasonInvalid
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		// An answer from the server: 5xx while it starts, 429, a timeout.
		if c := st.Status().Code; c == http.StatusServiceUnavailable || c == http.StatusGatewayTimeout {
			return ReasonUnreachable
		}
		return ReasonAPIError
	}
	// No answer at all: refused, no route, DNS, TLS, timeout.
	return ReasonUnreachable
}

// httpCode is " (HTTP 403)" for an error the API server answered, else "".
func httpCode(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Code != 0 {
		return fmt.Sprintf(" (HTTP %d)", st.Status().Code)
	}
	return ""
}

// conflict is a key another field manager owns with another value.
type conflict struct {
	label   bool
	key     string
	manager string // as the server words it: `"kubectl-label"`
}

func (c conflict) String() string {
	what := "annotation"
	if c.label {
		what = "label"
	}
	return fmt.Sprintf("%s %s is owned by %s with another value", what, c.key, c.manager)
}

// conflicts returns the label and annotation keys of an apply conflict, or
// nil if err is not one (or names other fields).
func conflicts(err error) []conflict {
	var st apierrors.APIStatus
	if !errors.As(err, &st) || st.Status().Reason != metav1.StatusReasonConflict || st.Status().Details == nil {
		return nil
	}
	var out []conflict
	for _, c := range st.Status().Details.Causes {
		if c.Type != metav1.CauseTypeFieldManagerConflict {
			continue
		}
		// The field is a structured-merge-diff path, whose map keys
		// follow a '.', dots and slashes of label keys included:
		// .metadata.labels.homelab.example/vpn-ingress.
		mgr := strings.TrimPrefix(c.Message, "conflict with ")
		switch {
		case strings.HasPrefix(c.Field, ".metadata.labels."):
			out = append(out, conflict{label: true, key: strings.TrimPrefix(c.Field, ".metadata.labels."), manager: mgr})
		case strings.HasPrefix(c.Field, ".metadata.annotations."):
			out = append(out, conflict{key: strings.TrimPrefix(c.Field, ".metadata.annotations."), manager: mgr})
		default:
			// A field nodeagent does not apply: not something to drop.
			return nil
		}
	}
	slices.SortFunc(out, func(a, b conflict) int { return strings.Compare(a.key, b.key) })
	return out
}
