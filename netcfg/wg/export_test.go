package wg

import "golang.zx2c4.com/wireguard/wgctrl/wgtypes"

// StageMessages waits for st's writes and returns how many genetlink
// messages its writer sent, and the bound for what it wrote: ceil(bytes /
// page) + 1, bytes being those of the device's fields and every peer it
// wrote, packed. Call it before Finish (which forgets the peers).
func StageMessages(st *Stage) (sent int64, bound int) {
	st.Close()
	st.mu.Lock()
	defer st.mu.Unlock()
	var cfg wgtypes.Config
	setDevice(&cfg, st.dev, deviceFields)
	for _, sp := range st.written {
		cfg.Peers = append(cfg.Peers, sp.config())
	}
	msgs, _ := messages(st.name, cfg, msgLimit)
	bytes := 0
	for _, m := range msgs {
		bytes += nlmsgHdrLen + genlHdrLen + len(m)
	}
	page := pageLimit()
	return st.msgs, (bytes+page-1)/page + 1
}

// SetDelLink makes s delete its stages with del, which a test may hold up.
func SetDelLink(s *Stager, del func(index int) error) { s.delLink = del }
