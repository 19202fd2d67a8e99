package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
)

// waitTarget is what --for names: readiness (cond ""; with healthy, also
// not degraded) or one condition having a status.
type waitTarget struct {
	cond    string
	status  string
	healthy bool
}

func (t waitTarget) String() string {
	switch {
	case t.cond == "" && t.healthy:
		return "healthy"
	case t.cond == "":
		return "ready"
	}
	return "condition/" + t.cond + "=" + t.status
}

// parseFor parses --for: ready, healthy, condition/NAME or
// condition/NAME=STATUS.
func parseFor(s string) (waitTarget, error) {
	switch s {
	case "ready":
		return waitTarget{}, nil
	case "healthy":
		return waitTarget{healthy: true}, nil
	}
	rest, ok := strings.CutPrefix(s, "condition/")
	if !ok {
		return waitTarget{}, fmt.Errorf("%q: want ready, healthy or condition/NAME[=STATUS]", s)
	}
	name, status, hasStatus := strings.Cut(rest, "=")
	if name == "" {
		return waitTarget{}, fmt.Errorf("%q: no condition name", s)
	}
	if !hasStatus {
		return waitTarget{cond: name, status: api.True}, nil
	}
	for _, v := range []string{api.True, api.False, api.Unknown} {
		if strings.EqualFold(status, v) {
			return waitTarget{cond: name, status: v}, nil
		}
	}
	return waitTarget{}, fmt.Errorf("%q: status %q: want True, False or Unknown", s, status)
}

// check reports whether s satisfies t, and if not, why not. Ready is the
// daemon's READY=1: the first full convergence done with nothing failed.
// A degraded node (a skipped peer file, a VIP that does not answer ARP) is
// ready: what waits for the network (k3s) may start, and may be what the
// degraded condition waits for. healthy is status's exit 0: ready and not
// degraded.
func (t waitTarget) check(s *api.Status) (bool, string) {
	if t.cond == "" {
		if s.Ready && !(t.healthy && s.Degraded) {
			return true, ""
		}
		return false, notReadyReason(s)
	}
	c := findCondition(s, t.cond)
	if c == nil {
		return false, "condition " + t.cond + " is not reported"
	}
	return c.Status == t.status, condString(c)
}

// findCondition is s.Condition, falling back to a case-insensitive match as
// kubectl wait does, so condition/converged works too.
func findCondition(s *api.Status, typ string) *api.Condition {
	if c := s.Condition(typ); c != nil {
		return c
	}
	for i := range s.Conditions {
		if strings.EqualFold(s.Conditions[i].Type, typ) {
			return &s.Conditions[i]
		}
	}
	return nil
}

// notReadyReason names the conditions that keep s from being ready. Ready
// itself is named only when nothing else is, since it is the effect and
// the others are the cause.
func notReadyReason(s *api.Status) string {
	var causes []string
	var ready *api.Condition
	for i, c := range s.Conditions {
		switch {
		case c.Type == api.CondReady:
			ready = &s.Conditions[i]
		case c.Status != api.True:
			causes = append(causes, condString(&s.Conditions[i]))
		}
	}
	if len(causes) > 0 {
		return strings.Join(causes, "; ")
	}
	if ready != nil && ready.Status != api.True {
		return condString(ready)
	}
	if s.Degraded {
		return "degraded"
	}
	return "not ready"
}

// condString is a condition as TYPE=STATUS (REASON: MESSAGE).
func condString(c *api.Condition) string {
	s := clean(c.Type) + "=" + clean(c.Status)
	switch {
	case c.Reason != "" && c.Message != "":
		s += " (" + clean(c.Reason) + ": " + clean(c.Message) + ")"
	case c.Reason != "":
		s += " (" + clean(c.Reason) + ")"
	case c.Message != "":
		s += " (" + clean(c.Message) + ")"
	}
	return s
}

// pollTimeout bounds one poll of wait.
const pollTimeout = 5 * time.Second

// wait polls the daemon until t holds or timeout passes. It fails closed:
// an unreachable daemon is not an answer, so it is polled again (at boot it
// may not have started yet), and the timeout ends the wait with exit 1,
// never with success.
func (c *cli) wait(ctx context.Context, client *api.Client, t waitTarget, timeout time.Duration) int {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := "no answer from nodeagent yet"
	var lastErr error // the error behind last, for the next step to suggest
	tick := time.NewTicker(c.poll)
	defer tick.Stop()
	for {
		// Each poll is bounded on its own, so a daemon that accepts and
		// hangs is asked again and named in the reason, rather than
		// holding the one request that eats the whole timeout.
		pctx, pcancel := context.WithTimeout(ctx, pollTimeout)
		s, err := client.Status(pctx)
		pcancel()
		var herr *api.HTTPError
		switch {
		case err == nil:
			ok, reason := t.check(s)
			if ok {
				switch {
				case t.cond == "" && s.Degraded:
					fmt.Fprintf(c.stdout, "%s (degraded: %s)\n", t, notReadyReason(s))
				case t.cond == "":
					fmt.Fprintln(c.stdout, t)
				default:
					fmt.Fprintln(c.stdout, reason)
				}
				return exitOK
			}
			last, lastErr = reason, nil
		case ctx.Err() != nil:
			// The request was cut short by the deadline; its error says
			// nothing about the daemon, so the reason before it stands.
		case errors.As(err, &herr) && herr.Code >= 400 && herr.Code < 500:
			// A 4xx is the daemon refusing this client (a missing group
			// membership, an unknown endpoint): waiting will not change it.
			fmt.Fprintf(c.stderr, "nodeagentctl: waiting for %s: %v\n", t, err)
			return exitFailure
		case errors.Is(err, context.DeadlineExceeded):
			last, lastErr = fmt.Sprintf("nodeagent at %s did not answer within %v", client.Socket(), pollTimeout), nil
		default:
			// Unreachable, a 5xx, a connection dropped by a restarting
			// daemon: all can clear up, so keep waiting.
			last, lastErr = err.Error(), err
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				fmt.Fprintf(c.stderr, "nodeagentctl: timed out after %v waiting for %s: %s\n", timeout, t, last)
			} else {
				fmt.Fprintf(c.stderr, "nodeagentctl: interrupted waiting for %s: %s\n", t, last)
			}
			if hint := nextStep(lastErr); hint != "" {
				fmt.Fprintf(c.stderr, "nodeagentctl: %s\n", hint)
			}
			return exitFailure
		case <-tick.C:
		}
	}
}
