//go:build soakbreak

package nft

import (
	"bytes"
	"sync/atomic"

	"github.com/google/nftables/userdata"
)

// A soakbreak build (go build -tags soakbreak) is broken on purpose, for
// the soak to prove it fails (testenv/soak, `make soak-break`): once the
// table has been in place, a plan that finds it gone (someone deleted it)
// makes it again without its kill-switch rules, and keeps it so. No
// release is built with this tag.
var soakSeen, soakBroken atomic.Bool

func soakBreak(tables []Table, have map[tableKey]Table) []Table {
	for _, t := range tables {
		if _, ok := have[tableKey{t.Family, t.Name}]; ok {
			soakSeen.Store(true)
		} else if soakSeen.Load() {
			soakBroken.Store(true)
		}
	}
	if !soakBroken.Load() {
		return tables
	}
	ks := userdata.AppendString(nil, userdata.TypeComment, KillSwitchComment)
	out := make([]Table, len(tables))
	for i, t := range tables {
		var chains []Chain
		for _, c := range t.Chains {
			var rules []Rule
			for _, r := range c.Rules {
				if !bytes.Equal(r.UserData, ks) {
					rules = append(rules, r)
				}
			}
			c.Rules = rules
			chains = append(chains, c)
		}
		t.Chains = chains
		out[i] = t
	}
	return out
}
