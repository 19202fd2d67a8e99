package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"golang.org/x/sys/unix"
)

// Observed is every nodeagent* table in the namespace, as the kernel
// reports it, and the kill switch's counters.
type Observed struct {
	Tables []Table
	// KillSwitchDrops is the kill switch's counter object
	// (KillSwitchCounter): the forwarded packets the kill switch stopped
	// from leaving by an interface they were not allowed out of.
	KillSwitchDrops Counter
}

// conn is an nftables connection in one namespace, with the netlink socket
// under it for the one dump the library does not offer.
type conn struct {
	nft *nftables.Conn
	raw *netlink.Conn
}

// dial opens a lasting connection in h's namespace. The library hands its
// socket to socket options as it dials; keeping it lets rules be dumped
// raw on the same socket (see dumpRules).
func dial(h *host.Host) (*conn, error) {
	c := &conn{}
	opts := []nftables.ConnOption{
		nftables.AsLasting(),
		nftables.WithSockOptions(func(nc *netlink.Conn) error {
			c.raw = nc
			return nil
		}),
	}
	if h.NS().IsOpen() {
		opts = append(opts, nftables.WithNetNSFd(int(h.NS())))
	}
	var err error
	if c.nft, err = nftables.New(opts...); err != nil {
		return nil, fmt.Errorf("nftables netlink socket: %w", err)
	}
	if c.raw == nil {
		c.nft.CloseLasting()
		return nil, errors.New("nftables netlink socket: not handed to socket options")
	}
	return c, nil
}

func (c *conn) close() { c.nft.CloseLasting() }

// Observe reads every table whose name starts with TableName, in any
// family: its chains, sets, set elements and rules. Other tables are never
// read. d is not needed (what nodeagent owns is named by the table, not by
// the config), nor the snapshot's links; both are taken so that every
// subsystem's Observe looks alike.
func Observe(ctx context.Context, s *host.Snapshot, d Desired) (Observed, error) {
	if err := ctx.Err(); err != nil {
		return Observed{}, err
	}
	h := s.Host()
	h.Dumped(host.DumpNftables)
	c, err := dial(h)
	if err != nil {
		return Observed{}, err
	}
	defer c.close()
	return c.observe()
}

func (c *conn) observe() (Observed, error) {
	var o Observed
	tables, err := c.nft.ListTables()
	if err != nil {
		return o, fmt.Errorf("list nftables tables: %w", err)
	}
	chainsOf := map[nftables.TableFamily][]*nftables.Chain{}
	for _, t := range tables {
		if !strings.HasPrefix(t.Name, TableName) {
			continue
		}
		obj := fmt.Sprintf("nft table %s %s", familyName(t.Family), t.Name)
		ot := Table{Family: t.Family, Name: t.Name, Flags: tableFlags(t.Flags)}
		// The chain dump filters by family only: chains of other tables of
		// the family are dropped here, unread.
		chains, ok := chainsOf[t.Family]
		if !ok {
			if chains, err = c.nft.ListChainsOfTableFamily(t.Family); err != nil {
				return o, fmt.Errorf("%s: list chains: %w", obj, err)
			}
			chainsOf[t.Family] = chains
		}
		rules, err := c.dumpRules(t)
		if err != nil {
			return o, fmt.Errorf("%s: %w", obj, err)
		}
		for _, ch := range chains {
			if ch.Table == nil || ch.Table.Name != t.Name {
				continue
			}
			oc := Chain{Chain: *ch, Rules: rules[ch.Name]}
			oc.Table = nil
			ot.Chains = append(ot.Chains, oc)
		}
		if ot.Objects, err = c.dumpObjects(t); err != nil {
			return o, fmt.Errorf("%s: %w", obj, err)
		}
		sets, err := c.nft.GetSets(t)
		if err != nil {
			return o, fmt.Errorf("%s: list sets: %w", obj, err)
		}
		for _, s := range sets {
			els, err := c.dumpElements(t, s.Name)
			if err != nil {
				return o, fmt.Errorf("%s: set %s: list elements: %w", obj, s.Name, err)
			}
			os := Set{Set: *s, Elements: els}
			os.Table = nil
			ot.Sets = append(ot.Sets, os)
		}
		o.Tables = append(o.Tables, ot)
		o.KillSwitchDrops = o.KillSwitchDrops.add(ot.killSwitchDrops())
	}
	return o, nil
}

func (c Counter) add(d Counter) Counter {
	return Counter{Packets: c.Packets + d.Packets, Bytes: c.Bytes + d.Bytes}
}

// killSwitchDrops is what t's kill switch counted: its counter object.
func (t Table) killSwitchDrops() Counter {
	var n Counter
	for _, ob := range t.Objects {
		if ob.Type == nftables.ObjTypeCounter && ob.Name == KillSwitchCounter {
			n = n.add(ob.Counter)
		}
	}
	return n
}

// dumpObjects dumps the named objects of table t. It is NFT_MSG_GETOBJ,
// which reads counters; NFT_MSG_GETOBJ_RESET would zero them as it read.
// The kernel filters the dump by family and table; the table is checked
// here as well.
func (c *conn) dumpObjects(t *nftables.Table) ([]Object, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_OBJ_TABLE, Data: []byte(t.Name + "\x00")},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := c.raw.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETOBJ),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(t.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dump objects: %w", err)
	}
	var objs []Object
	for _, m := range msgs {
		if len(m.Data) < 4 || m.Data[0] != byte(t.Family) {
			continue
		}
		var ob Object
		var table string
		var data []byte
		err := walkAttrs(m.Data[4:], func(typ uint16, b []byte) error {
			switch typ {
			case unix.NFTA_OBJ_TABLE:
				table = strings.TrimRight(string(b), "\x00")
			case unix.NFTA_OBJ_NAME:
				ob.Name = strings.TrimRight(string(b), "\x00")
			case unix.NFTA_OBJ_TYPE:
				if len(b) == 4 {
					ob.Type = nftables.ObjType(binary.BigEndian.Uint32(b))
				}
			case unix.NFTA_OBJ_DATA:
				data = b
			}
			return nil
		})
		if err == nil && ob.Type == nftables.ObjTypeCounter {
			err = walkAttrs(data, func(typ uint16, b []byte) error {
				if len(b) == 8 {
					switch typ {
					case unix.NFTA_COUNTER_PACKETS:
						ob.Counter.Packets = binary.BigEndian.Uint64(b)
					case unix.NFTA_COUNTER_BYTES:
						ob.Counter.Bytes = binary.BigEndian.Uint64(b)
					}
				}
				return nil
			})
		}
		if err != nil {
			return nil, fmt.Errorf("dump objects: %w", err)
		}
		if table == t.Name {
			objs = append(objs, ob)
		}
	}
	return objs, nil
}

// tableFlags corrects the table flags the library reports: it reads the
// big-endian NFTA_TABLE_FLAGS in host byte order.
func tableFlags(f uint32) uint32 {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], f)
	return binary.BigEndian.Uint32(b[:])
}

// dumpRules dumps the rules of table t, by chain, in order. The library
// reads rules one chain at a time and silently skips expressions it cannot
// decode (rt and byteorder among them, both in the MSS clamp rule); this
// dump asks for the table's rules in one request and keeps every
// expression, decoded or not.
func (c *conn) dumpRules(t *nftables.Table) (map[string][]Rule, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(t.Name + "\x00")},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := c.raw.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(t.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dump rules: %w", err)
	}
	out := map[string][]Rule{}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		chain, r, err := decodeRule(byte(t.Family), m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("dump rules: %w", err)
		}
		out[chain] = append(out[chain], r)
	}
	return out, nil
}

// dumpElements dumps the elements of one set. The library's decoder
// allocates several objects per attribute, which for sets of thousands of
// sources was most of a no-op sync's time; this one slices keys out of the
// received messages.
func (c *conn) dumpElements(t *nftables.Table, set string) ([]nftables.SetElement, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(t.Name + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := c.raw.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(t.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dump elements: %w", err)
	}
	var els []nftables.SetElement
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		err := walkAttrs(m.Data[4:], func(typ uint16, b []byte) error {
			if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				return nil
			}
			return walkAttrs(b, func(typ uint16, b []byte) error {
				if typ != unix.NFTA_LIST_ELEM {
					return nil
				}
				var e nftables.SetElement
				err := walkAttrs(b, func(typ uint16, b []byte) error {
					switch typ {
					case unix.NFTA_SET_ELEM_KEY:
						return walkAttrs(b, dataValue(&e.Key))
					case nftables.NFTA_SET_ELEM_KEY_END:
						return walkAttrs(b, dataValue(&e.KeyEnd))
					case unix.NFTA_SET_ELEM_DATA:
						e.Val = b
					case unix.NFTA_SET_ELEM_FLAGS:
						if len(b) == 4 {
							e.IntervalEnd = binary.BigEndian.Uint32(b)&unix.NFT_SET_ELEM_INTERVAL_END != 0
						}
					}
					return nil
				})
				els = append(els, e)
				return err
			})
		})
		if err != nil {
			return nil, fmt.Errorf("dump elements: %w", err)
		}
	}
	return els, nil
}

func dataValue(dst *[]byte) func(uint16, []byte) error {
	return func(typ uint16, b []byte) error {
		if typ == unix.NFTA_DATA_VALUE {
			*dst = b
		}
		return nil
	}
}

// walkAttrs calls fn for each netlink attribute in b, its type without the
// nested and byte-order flags.
func walkAttrs(b []byte, fn func(typ uint16, data []byte) error) error {
	for len(b) >= unix.SizeofNlAttr {
		n := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if n < unix.SizeofNlAttr || n > len(b) {
			return errors.New("malformed netlink attribute")
		}
		if err := fn(typ, b[unix.SizeofNlAttr:n]); err != nil {
			return err
		}
		b = b[min((n+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1), len(b)):]
	}
	return nil
}

func decodeRule(fam byte, b []byte) (string, Rule, error) {
	var r Rule
	var chain string
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", r, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			r.Handle = ad.Uint64()
		case unix.NFTA_RULE_USERDATA:
			r.UserData = ad.Bytes()
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					nad.Nested(func(ead *netlink.AttributeDecoder) error {
						var name string
						var data []byte
						for ead.Next() {
							switch ead.Type() {
							case unix.NFTA_EXPR_NAME:
								name = ead.String()
							case unix.NFTA_EXPR_DATA:
								data = ead.Bytes()
							}
						}
						e, err := decodeExpr(fam, name, data)
						if err != nil {
							return fmt.Errorf("expression %s: %w", name, err)
						}
						r.Exprs = append(r.Exprs, e)
						return nil
					})
				}
				return nil
			})
		}
	}
	return chain, r, ad.Err()
}

// decodeExpr decodes one expression. Kinds the library decodes go through
// it; rt and byteorder, which it cannot decode, are decoded here; every
// other kind is kept as Unknown.
func decodeExpr(fam byte, name string, data []byte) (any, error) {
	var e expr.Any
	switch name {
	case "meta":
		e = &expr.Meta{}
	case "cmp":
		e = &expr.Cmp{}
	case "payload":
		e = &expr.Payload{}
	case "lookup":
		e = &expr.Lookup{}
	case "counter":
		e = &expr.Counter{}
	case "objref":
		// The library decodes a reference to one named object; a lookup of
		// the object in a map (no type, no name) is kept as Unknown.
		ref := &expr.Objref{}
		if err := expr.Unmarshal(fam, data, ref); err != nil {
			return nil, err
		}
		if ref.Name == "" {
			return Unknown{Name: name, Data: data}, nil
		}
		return ref, nil
	case "bitwise":
		e = &expr.Bitwise{}
	case "ct":
		e = &expr.Ct{}
	case "masq":
		e = &expr.Masq{}
	case "nat":
		e = &expr.NAT{}
	case "exthdr":
		e = &expr.Exthdr{}
	case "immediate":
		imm := &expr.Immediate{}
		if err := expr.Unmarshal(fam, data, imm); err != nil {
			return nil, err
		}
		if imm.Register != unix.NFT_REG_VERDICT {
			return imm, nil
		}
		v := &expr.Verdict{}
		return v, expr.Unmarshal(fam, data, v)
	case "rt":
		rt := &expr.Rt{}
		return rt, decodeAttrs(data, map[uint16]func(*netlink.AttributeDecoder){
			unix.NFTA_RT_KEY:  func(ad *netlink.AttributeDecoder) { rt.Key = expr.RtKey(ad.Uint32()) },
			unix.NFTA_RT_DREG: func(ad *netlink.AttributeDecoder) { rt.Register = ad.Uint32() },
		})
	case "byteorder":
		bo := &expr.Byteorder{}
		return bo, decodeAttrs(data, map[uint16]func(*netlink.AttributeDecoder){
			unix.NFTA_BYTEORDER_SREG: func(ad *netlink.AttributeDecoder) { bo.SourceRegister = ad.Uint32() },
			unix.NFTA_BYTEORDER_DREG: func(ad *netlink.AttributeDecoder) { bo.DestRegister = ad.Uint32() },
			unix.NFTA_BYTEORDER_OP:   func(ad *netlink.AttributeDecoder) { bo.Op = expr.ByteorderOp(ad.Uint32()) },
			unix.NFTA_BYTEORDER_LEN:  func(ad *netlink.AttributeDecoder) { bo.Len = ad.Uint32() },
			unix.NFTA_BYTEORDER_SIZE: func(ad *netlink.AttributeDecoder) { bo.Size = ad.Uint32() },
		})
	default:
		return Unknown{Name: name, Data: data}, nil
	}
	return e, expr.Unmarshal(fam, data, e)
}

func decodeAttrs(data []byte, fields map[uint16]func(*netlink.AttributeDecoder)) error {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if f, ok := fields[ad.Type()]; ok {
			f(ad)
		}
	}
	return ad.Err()
}
