package logging

import (
	"context"
	"log/slog"

	"k8s.io/klog/v2"
)

// RouteKlog sends what client-go logs through klog (leader election's
// "attempting to acquire", a refused or failed Lease update, which are
// steps of the gateway role's election, not faults) to log at Debug, with
// subsystem=client-go, instead of klog's own lines on stderr. klog is
// process-wide, so only a command's main calls this.
func RouteKlog(log *slog.Logger) {
	klog.SetSlogLogger(slog.New(debugOnly{log.Handler()}).With("subsystem", "client-go"))
}

// debugOnly lowers every record to Debug.
type debugOnly struct{ h slog.Handler }

func (d debugOnly) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugOnly) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d debugOnly) WithAttrs(a []slog.Attr) slog.Handler { return debugOnly{d.h.WithAttrs(a)} }
func (d debugOnly) WithGroup(n string) slog.Handler      { return debugOnly{d.h.WithGroup(n)} }
