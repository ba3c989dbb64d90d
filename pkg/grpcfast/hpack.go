package grpcfast

// The answers' header blocks. They never use hpack's dynamic table (always
// legal for an encoder), so a block does not depend on what was written
// before it and is built without the connection's write lock: the fixed
// ones once, the others with appendLiteral.

import (
	"encoding/base64"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"
)

// respHeaders is ":status: 200" (static table index 8) and
// "content-type: application/grpc" (literal without indexing, name index 31).
var respHeaders = appendString(append([]byte{0x88}, 0x0f, 0x10), "application/grpc")

// okTrailers is "grpc-status: 0".
var okTrailers = appendLiteral(nil, "grpc-status", "0")

// appendInt appends v as an hpack integer with an n-bit prefix whose other
// bits are first's (RFC 7541 §5.1).
func appendInt(b []byte, first byte, n uint, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(limit))
	v -= limit
	for v >= 128 {
		b = append(b, byte(v&0x7f)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// appendString appends s as an hpack string literal, not Huffman-coded.
func appendString(b []byte, s string) []byte {
	return append(appendInt(b, 0, 7, uint64(len(s))), s...)
}

// appendLiteral appends a header field as a literal without indexing with a
// literal name (RFC 7541 §6.2.2).
func appendLiteral(b []byte, name, value string) []byte {
	return appendString(appendString(append(b, 0), name), value)
}

// maxMessageLen bounds the grpc-message of an answer: a status message is
// for people, and a header block must fit what the client accepts.
const maxMessageLen = 4 << 10

// appendStatus appends grpc-status, grpc-message (percent-encoded, as the
// gRPC spec asks) and grpc-status-details-bin when there are details.
func appendStatus(b []byte, code uint32, msg string, details []byte) []byte {
	b = appendLiteral(b, "grpc-status", strconv.FormatUint(uint64(code), 10))
	if msg != "" {
		if len(msg) > maxMessageLen {
			msg = msg[:maxMessageLen]
		}
		b = appendLiteral(b, "grpc-message", encodeMessage(msg))
	}
	if len(details) > 0 && len(details) <= maxMessageLen {
		b = appendLiteral(b, "grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(details))
	}
	return b
}

// appendMD appends md's fields (binary ones base64-coded), skipping the
// names gRPC reserves.
func appendMD(b []byte, md metadata.MD) []byte {
	for k, vs := range md {
		if reserved(k) {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = base64.RawStdEncoding.EncodeToString([]byte(v))
			}
			b = appendLiteral(b, k, v)
		}
	}
	return b
}

// encodeMessage percent-encodes what is not printable ASCII, and '%'.
func encodeMessage(msg string) string {
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			return percentEncode(msg)
		}
	}
	return msg
}

func percentEncode(msg string) string {
	const hex = "0123456789ABCDEF"
	var sb strings.Builder
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			sb.WriteByte('%')
			sb.WriteByte(hex[c>>4])
			sb.WriteByte(hex[c&0xf])
		} else {
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

// reserved reports whether a header name is the transport's, not the
// call's metadata (grpc-go's isReservedHeader, and HTTP/2's pseudo-headers).
func reserved(name string) bool {
	if strings.HasPrefix(name, ":") {
		return true
	}
	switch name {
	case "content-type", "user-agent", "grpc-message-type", "grpc-encoding", "grpc-message", "grpc-status",
		"grpc-timeout", "grpc-status-details-bin", "te", "grpc-accept-encoding", "connection":
		return true
	}
	return false
}
