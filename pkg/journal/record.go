package journal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/segmentio/kafka-go"
)

// Journal file format (see docs/journal.md).
//
// A segment file starts with the 8-byte segmentMagic, then holds records:
//
//	uint32 big-endian  payload length (1 .. maxJournalRecord)
//	uint32 big-endian  CRC-32C (Castagnoli) of the payload
//	payload:
//	  byte     record version (1)
//	  uvarint  topic length, topic
//	  bytes    key                         (bytes = uvarint n+1 then n bytes; 0 = nil)
//	  bytes    value
//	  uvarint  header count, then per header: uvarint key length, key, bytes value
//	  varint   message time, Unix nanoseconds (0 = zero time)
const (
	segmentMagic        = "FGJRNL\x00\x01"
	recordHeaderSize    = 8
	recordVersion       = 1
	maxJournalRecord    = 64 << 20 // sanity bound: a torn length field reads as garbage
	segmentFileSuffix   = ".seg"
	checkpointSuffix    = ".ack"
	checkpointFileBytes = 20 // int64 offset, int64 records, uint32 CRC-32C of the 16 bytes
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errTornRecord marks the end of a segment's valid records: a short read, an
// impossible length, or a CRC mismatch.
var errTornRecord = errors.New("torn or corrupt journal record")

// appendRecord appends m's framed record to dst.
func appendRecord(dst []byte, m *kafka.Message) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recordHeaderSize)...)
	dst = append(dst, recordVersion)
	dst = binary.AppendUvarint(dst, uint64(len(m.Topic)))
	dst = append(dst, m.Topic...)
	dst = appendNullable(dst, m.Key)
	dst = appendNullable(dst, m.Value)
	dst = binary.AppendUvarint(dst, uint64(len(m.Headers)))
	for _, h := range m.Headers {
		dst = binary.AppendUvarint(dst, uint64(len(h.Key)))
		dst = append(dst, h.Key...)
		dst = appendNullable(dst, h.Value)
	}
	var ts int64
	if !m.Time.IsZero() {
		ts = m.Time.UnixNano()
	}
	dst = binary.AppendVarint(dst, ts)
	payload := dst[start+recordHeaderSize:]
	binary.BigEndian.PutUint32(dst[start:], uint32(len(payload)))
	binary.BigEndian.PutUint32(dst[start+4:], crc32.Checksum(payload, castagnoli))
	return dst
}

func appendNullable(dst, b []byte) []byte {
	if b == nil {
		return append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(b))+1)
	return append(dst, b...)
}

// decodeRecord decodes a record payload (after its length and CRC were
// checked). The message's slices alias payload.
func decodeRecord(payload []byte) (kafka.Message, error) {
	d := recordDecoder{b: payload}
	var m kafka.Message
	if v := d.byte(); d.err == nil && v != recordVersion {
		return m, fmt.Errorf("decode journal record: unknown version %d", v)
	}
	m.Topic = string(d.bytes(d.uvarint()))
	m.Key = d.nullable()
	m.Value = d.nullable()
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) { // each header takes at least 2 bytes
		d.err = io.ErrUnexpectedEOF
	}
	if d.err == nil && n > 0 {
		m.Headers = make([]kafka.Header, 0, n)
		for range n {
			k := string(d.bytes(d.uvarint()))
			v := d.nullable()
			if d.err != nil {
				break
			}
			m.Headers = append(m.Headers, kafka.Header{Key: k, Value: v})
		}
	}
	ts, k := binary.Varint(d.b)
	if d.err == nil && k <= 0 {
		d.err = io.ErrUnexpectedEOF
	}
	if d.err == nil {
		d.b = d.b[k:]
		if ts != 0 {
			m.Time = time.Unix(0, ts).UTC()
		}
		if len(d.b) != 0 {
			d.err = fmt.Errorf("%d trailing bytes", len(d.b))
		}
	}
	if d.err != nil {
		return kafka.Message{}, fmt.Errorf("decode journal record: %w", d.err)
	}
	return m, nil
}

type recordDecoder struct {
	b   []byte
	err error
}

func (d *recordDecoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.err = io.ErrUnexpectedEOF
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *recordDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = io.ErrUnexpectedEOF
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *recordDecoder) bytes(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = io.ErrUnexpectedEOF
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *recordDecoder) nullable() []byte {
	n := d.uvarint()
	if d.err != nil || n == 0 {
		return nil
	}
	return d.bytes(n - 1)
}

// recordReader reads framed records from a segment positioned after its magic.
type recordReader struct {
	r   *bufio.Reader
	hdr [recordHeaderSize]byte
	buf []byte
}

func newRecordReader(r io.Reader) *recordReader {
	return &recordReader{r: bufio.NewReaderSize(r, 256<<10)}
}

// next returns the next record's payload (valid until the following call) and
// its framed size. It returns io.EOF at a clean end and errTornRecord for a
// partial or corrupt record.
func (rr *recordReader) next() ([]byte, int64, error) {
	n, err := io.ReadFull(rr.r, rr.hdr[:])
	if err == io.EOF {
		return nil, 0, io.EOF
	}
	if err != nil {
		if n > 0 && errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, 0, fmt.Errorf("%w: %d-byte header", errTornRecord, n)
		}
		return nil, 0, err
	}
	size := binary.BigEndian.Uint32(rr.hdr[:4])
	if size == 0 || size > maxJournalRecord {
		return nil, 0, fmt.Errorf("%w: length %d", errTornRecord, size)
	}
	if cap(rr.buf) < int(size) {
		rr.buf = make([]byte, size)
	}
	rr.buf = rr.buf[:size]
	if _, err := io.ReadFull(rr.r, rr.buf); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
			return nil, 0, fmt.Errorf("%w: short payload", errTornRecord)
		}
		return nil, 0, err
	}
	if crc32.Checksum(rr.buf, castagnoli) != binary.BigEndian.Uint32(rr.hdr[4:]) {
		return nil, 0, fmt.Errorf("%w: checksum mismatch", errTornRecord)
	}
	return rr.buf, int64(recordHeaderSize) + int64(size), nil
}

// scanSegment reads a whole segment (magic included) and returns how many
// valid records it holds, the byte offset just after the last one, and the
// record boundaries seen (so a checkpoint can be checked against them).
// A torn or corrupt record ends the scan: validSize stops before it and torn
// is true. Payloads are not decoded here: one with a good CRC that does not
// decode (a format bug, not a torn write) is left for the drainer to count.
func scanSegment(r io.Reader, onRecord func(end int64)) (records, validSize int64, torn bool, err error) {
	magic := make([]byte, len(segmentMagic))
	if n, err := io.ReadFull(r, magic); err != nil {
		if n == 0 && err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, 0, true, nil
		}
		return 0, 0, false, fmt.Errorf("read segment magic: %w", err)
	}
	if string(magic) != segmentMagic {
		return 0, 0, false, fmt.Errorf("not a journal segment (magic %q)", magic)
	}
	validSize = int64(len(segmentMagic))
	rr := newRecordReader(r)
	for {
		_, n, err := rr.next()
		if errors.Is(err, io.EOF) {
			return records, validSize, false, nil
		}
		if errors.Is(err, errTornRecord) {
			return records, validSize, true, nil
		}
		if err != nil {
			return records, validSize, false, fmt.Errorf("read segment: %w", err)
		}
		records++
		validSize += n
		if onRecord != nil {
			onRecord(validSize)
		}
	}
}

func encodeCheckpoint(off, records int64) []byte {
	b := make([]byte, checkpointFileBytes)
	binary.BigEndian.PutUint64(b, uint64(off))
	binary.BigEndian.PutUint64(b[8:], uint64(records))
	binary.BigEndian.PutUint32(b[16:], crc32.Checksum(b[:16], castagnoli))
	return b
}

func decodeCheckpoint(b []byte) (off, records int64, ok bool) {
	if len(b) != checkpointFileBytes || crc32.Checksum(b[:16], castagnoli) != binary.BigEndian.Uint32(b[16:]) {
		return 0, 0, false
	}
	off, records = int64(binary.BigEndian.Uint64(b)), int64(binary.BigEndian.Uint64(b[8:]))
	return off, records, off >= 0 && records >= 0
}
