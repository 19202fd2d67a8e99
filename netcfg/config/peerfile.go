package config

import (
	"reflect"

	"gopkg.in/yaml.v3"
)

// A WireGuard peer may also be written in a register file (netcfg/register:
// one peer per file in a peersDir), as YAML or as a wg-quick stanza. This is
// the config's decoder and peer check for such a file, so that a peer is
// held to the same rules wherever it is written.

// Lines maps a field path ("publicKey", "allowedIPs[1]") to the line it was
// written on; "" is where a missing field is reported.
type Lines map[string]int

// Line returns the line of path, or of its nearest ancestor that was
// written, or 0.
func (l Lines) Line(path string) int {
	v := validator{pos: positions(l)}
	return v.line(path)
}

// PeerFile is one register file's peer as it is being read.
type PeerFile struct {
	File  string
	Lines Lines
	// Bad holds the fields whose value could not be decoded; they are
	// reported already, so the check stays quiet about them.
	Bad map[string]bool
	// Rename turns a field path into the name errors print (a wg-quick
	// file names its fields as wg(8) does: PublicKey); nil prints paths.
	Rename func(path string) string
	// Errs are the problems found so far.
	Errs ErrorList
	// MaxErrs is how many errors are kept; Dropped counts the rest.
	MaxErrs, Dropped int
}

// DecodePeerYAML decodes a YAML register file, whose top level is a
// WGPeer, with the config's decoder: unknown fields, wrong types and
// duplicate keys are errors at their lines. line is the top-level mapping's
// (0 for an empty file). A file that is not YAML, or whose top level is not
// a mapping, is only errs. Scalars in errors are quoted, so the register
// can decide which of them may be shown.
func DecodePeerYAML(file string, data []byte, maxErrs int) (peer WGPeer, line int, pf *PeerFile, errs ErrorList) {
	root, errs := readDocument(file, data)
	if len(errs) > 0 {
		return WGPeer{}, 0, nil, errs
	}
	d := &decoder{file: file, pos: positions{}, bad: map[string]bool{}, budget: registerDecodeBudget, maxErrs: maxErrs, redact: true}
	if root != nil {
		for root.Kind == yaml.AliasNode && root.Alias != nil {
			root = root.Alias
		}
		line = root.Line
		if root.Kind != yaml.MappingNode {
			// Not the decoder's "expected a mapping, got ...": it quotes a
			// scalar, and a file holding just a key is a likely mistake.
			what := "a single value"
			if root.Kind == yaml.SequenceNode {
				what = "a list"
			}
			return WGPeer{}, line, nil, ErrorList{{File: file, Line: line,
				Msg: "expected a mapping of peer fields, like publicKey and allowedIPs; got " + what}}
		}
		d.pos[""] = line
		d.decode(root, reflect.ValueOf(&peer).Elem(), "")
	}
	return peer, line, &PeerFile{File: file, Lines: Lines(d.pos), Bad: d.bad, Errs: d.errs, MaxErrs: maxErrs, Dropped: d.dropped}, nil
}

// Check checks peer with the config's own peer rules and returns every
// problem of the file (those found before too), sorted by line, or nil.
func (pf *PeerFile) Check(peer WGPeer, opts Options) ErrorList {
	v := &validator{file: pf.File, pos: positions(pf.Lines), bad: pf.Bad, opts: opts, rename: pf.Rename,
		errs: pf.Errs, maxErrs: pf.MaxErrs, dropped: pf.Dropped}
	if v.pos == nil {
		v.pos = positions{}
	}
	v.peer("", peer, newPeerSeen())
	return v.list()
}

// IndexPath is the field path of item i of the list at parent, as errors
// and Lines name it: allowedIPs[1].
func IndexPath(parent string, i int) string { return indexPath(parent, i) }

// Suggest returns the name among names closest to s, for a "did you mean"
// hint, or "".
func Suggest(s string, names []string) string { return suggest(s, names) }

// Sorted returns a copy of l ordered by line (a count of errors not kept
// last).
func (l ErrorList) Sorted() ErrorList { return l.sorted() }

// MoreErrors is the line that ends a capped list: "and N more error(s)
// WHERE, not listed".
func MoreErrors(file string, n int, where string) *FieldError { return moreErrors(file, n, where) }
