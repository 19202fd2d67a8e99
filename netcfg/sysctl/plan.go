package sysctl

import (
	"cmp"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

// MakePlan computes the ops that take o to d. It is a pure function.
func MakePlan(d Desired, o Observed) Plan {
	type want struct {
		value string // trimmed, as it will be written
		from  string // the configured key
		globs int
	}
	wants := map[string]want{}
	conflicts := map[string]string{}
	coming := map[string]bool{}
	for _, c := range o.Coming {
		coming[c] = true
	}
	var ops []Op
	set := func(key string, w want) {
		prev, ok := wants[key]
		switch {
		case !ok || w.globs < prev.globs:
			wants[key] = w
			delete(conflicts, key)
		case w.globs == prev.globs && !equalValue(w.value, prev.value):
			conflicts[key] = fmt.Sprintf("conflicting values %s (from %s) and %s (from %s)",
				show(normalize(prev.value)), prev.from, show(normalize(w.value)), w.from)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(d.Values)) {
		names, err := parseKey(k)
		if err != nil {
			ops = append(ops, Op{Kind: OpFail, Key: k, Reason: "invalid key: " + err.Error()})
			continue
		}
		w := want{value: strings.TrimSpace(d.Values[k]), from: k, globs: globs(names)}
		if w.globs == 0 {
			set(k, w)
			continue
		}
		matches := o.Matches[k]
		if perIface(names) && globs(names[:3]) == 0 && globs(names[4:]) == 0 {
			// Only the interface segment is a glob: it covers the
			// interfaces this sync creates too.
			for _, c := range slices.Sorted(maps.Keys(coming)) {
				if ok, _ := path.Match(names[3], c); ok {
					key := keyOf(append(append(slices.Clone(names[:3]), c), names[4:]...))
					if !slices.Contains(matches, key) {
						matches = append(matches, key)
					}
				}
			}
		}
		if len(matches) == 0 {
			if perIface(names) && globs(names[:3]) == 0 && globs(names[4:]) == 0 {
				// Only the interface segment is a glob: no interface
				// matches yet, and one created later will.
				ops = append(ops, Op{Kind: OpPending, Key: k, Reason: "no interface matches yet"})
			} else {
				ops = append(ops, Op{Kind: OpFail, Key: k, Reason: "no key matches"})
			}
			continue
		}
		for _, m := range matches {
			set(m, w)
		}
	}
	for key, w := range wants {
		if c, ok := conflicts[key]; ok {
			ops = append(ops, Op{Kind: OpFail, Key: key, Reason: c})
			continue
		}
		if op, ok := planKey(key, w.value, o.Keys[key], coming); ok {
			ops = append(ops, op)
		}
	}
	slices.SortFunc(ops, func(a, b Op) int {
		return cmp.Or(cmp.Compare(rank(a.Key), rank(b.Key)), strings.Compare(a.Key, b.Key))
	})
	return Plan{Ops: ops, Desired: d, Observed: o}
}

// planKey returns the op that gives key the value v, and false when it has
// it already. A key of an interface in coming, which this sync creates, is
// set once the interface exists.
func planKey(key, v string, ok ObservedKey, coming map[string]bool) (Op, bool) {
	fail := func(kind OpKind, format string, a ...any) (Op, bool) {
		return Op{Kind: kind, Key: key, Reason: fmt.Sprintf(format, a...)}, true
	}
	if !ok.Exists {
		if names, err := parseKey(key); err == nil && perIface(names) && coming[names[3]] {
			return Op{Kind: OpSet, Key: key, New: v, NewIface: true}, true
		}
	}
	switch {
	case !ok.Exists && ok.Iface != "" && !ok.IfaceExists:
		return fail(OpPending, "no such key yet (interface %s not present)", ok.Iface)
	case !ok.Exists && ok.Iface != "":
		segs := strings.SplitN(key, ".", 4)
		return fail(OpFail, "no such key: interface %s exists but has no %s entry", ok.Iface, strings.Join(segs[:3], "."))
	case !ok.Exists:
		return fail(OpFail, "no such key")
	case ok.Unreadable != "":
		return fail(OpFail, "%s", ok.Unreadable)
	case equalValue(ok.Raw, v):
		return Op{}, false
	}
	return Op{Kind: OpSet, Key: key, Old: normalize(ok.Raw), New: v}, true
}
