// Package netstamp reads, with what a TCP read returns, when the kernel
// received it (SO_TIMESTAMPNS): the time a caller's bytes reached this
// machine, whatever this process's run queue made its reader wait after
// that. A TCP read is stamped with the receive time of the last segment it
// returned, so the stamp is never earlier than any of its bytes' arrival.
package netstamp
