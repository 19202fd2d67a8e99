package config

import "time"

// The port hook's defaults and bounds (portForward.every, hookTimeout).
const (
	DefaultPortHookEvery   = 5 * time.Minute
	DefaultPortHookTimeout = 30 * time.Second
	minPortHookEvery       = 5 * time.Second
	maxPortHookEvery       = 24 * time.Hour
	minPortHookTimeout     = time.Second
	maxPortHookTimeout     = 10 * time.Minute
)

// HookEvery is how often onChange runs again after a success; 0: never.
func (pf PortForward) HookEvery() time.Duration {
	if pf.Every == nil {
		return DefaultPortHookEvery
	}
	return *pf.Every
}

// HookTimeoutOrDefault is what bounds one onChange run.
func (pf PortForward) HookTimeoutOrDefault() time.Duration {
	if pf.HookTimeout == 0 {
		return DefaultPortHookTimeout
	}
	return pf.HookTimeout
}

// portHook checks a portForward section's every and hookTimeout (p is the
// section's path).
func (v *validator) portHook(p string, pf PortForward) {
	if pf.Every != nil {
		if e := *pf.Every; e != 0 && (e < minPortHookEvery || e > maxPortHookEvery) {
			v.errorf(fieldPath(p, "every"), "%s is outside 5s-24h", e)
		}
		if len(pf.OnChange) == 0 {
			v.errorf(fieldPath(p, "every"), "set, but there is no onChange to run")
		}
	}
	if pf.HookTimeout != 0 {
		if t := pf.HookTimeout; t < minPortHookTimeout || t > maxPortHookTimeout {
			v.errorf(fieldPath(p, "hookTimeout"), "%s is outside 1s-10m", t)
		}
		if len(pf.OnChange) == 0 {
			v.errorf(fieldPath(p, "hookTimeout"), "set, but there is no onChange to run")
		}
	}
}
