package grpcfast

// Answers the flow-control windows hold: each waits in one of two lists,
// for the window it lacks, and a WINDOW_UPDATE tries only the streams it can
// let send — a client that keeps many streams waiting on tiny windows costs
// the server work for the answers each frame lets out, not for every stream
// that waits.
//
// Under the connection's mu:
//   - streamWait holds the streams whose own window is spent (sendAvail <= 0),
//     in the order they began to wait; a stream's WINDOW_UPDATE takes it out.
//   - connWait holds the streams whose own window has room but the
//     connection's has none, in the order they began to wait for it; it is
//     empty whenever the connection window has room. A connection
//     WINDOW_UPDATE sends from its head until the window is spent again.
//   - A stream is in at most one of them, and only while it is open and has
//     answer bytes to send: it leaves when they are sent, when it ends
//     (answered, reset by either side) and when the connection closes.

// waitList is a FIFO of streams linked through the streams themselves:
// joining, leaving and taking the first allocate nothing and cost the same
// however many wait.
type waitList struct{ head, tail *stream }

// push appends st, which is in no list.
func (l *waitList) push(st *stream) {
	st.waiting, st.prev, st.next = l, l.tail, nil
	if l.tail != nil {
		l.tail.next = st
	} else {
		l.head = st
	}
	l.tail = st
}

// remove takes st, which is in l, out of it.
func (l *waitList) remove(st *stream) {
	if st.prev != nil {
		st.prev.next = st.next
	} else {
		l.head = st.next
	}
	if st.next != nil {
		st.next.prev = st.prev
	} else {
		l.tail = st.prev
	}
	st.waiting, st.prev, st.next = nil, nil, nil
}

// clear takes every stream out of l.
func (l *waitList) clear() {
	for st := l.head; st != nil; {
		next := st.next
		st.waiting, st.prev, st.next = nil, nil, nil
		st = next
	}
	*l = waitList{}
}

// waitLocked puts st, whose answer the windows hold, in the list of the
// window it lacks (its own first); where it already waits there, it keeps
// its place.
func (c *conn) waitLocked(st *stream) {
	l := &c.connWait
	if st.sendAvail <= 0 {
		l = &c.streamWait
	}
	if st.waiting == l {
		return
	}
	c.unwaitLocked(st)
	l.push(st)
}

// unwaitLocked takes st out of the list it waits in, if any.
func (c *conn) unwaitLocked(st *stream) {
	if st.waiting != nil {
		st.waiting.remove(st)
	}
}

// retryLocked sends what the windows now allow of a waiting answer.
func (c *conn) retryLocked(st *stream) {
	c.retried++
	c.sendLocked(st)
	if st.m.stream != nil {
		c.room.Broadcast() // its SendMsg may wait for the window
	}
}

// streamRoomLocked follows st's window growing (its WINDOW_UPDATE): an
// answer that waited for it is tried at once if the connection window has
// room (then no other stream waits for that), or else waits for it behind
// those already waiting.
func (c *conn) streamRoomLocked(st *stream) {
	if st.waiting != &c.streamWait || st.sendAvail <= 0 {
		return
	}
	if c.sendAvail <= 0 {
		c.streamWait.remove(st)
		c.connWait.push(st)
		return
	}
	c.retryLocked(st)
}

// connRoomLocked follows the connection window growing: the answers
// waiting for it are sent in their order until it is spent again. Each try
// takes its stream out of connWait or spends the window.
func (c *conn) connRoomLocked() {
	for c.sendAvail > 0 && c.connWait.head != nil {
		c.retryLocked(c.connWait.head)
	}
}

// peerWindowLocked follows SETTINGS_INITIAL_WINDOW_SIZE moving every
// stream's window: the waiting streams are sorted again by the window they
// now lack, in their order, and the connection window's room is used.
func (c *conn) peerWindowLocked() {
	for st := c.connWait.head; st != nil; {
		next := st.next
		if st.sendAvail <= 0 {
			c.connWait.remove(st)
			c.streamWait.push(st)
		}
		st = next
	}
	for st := c.streamWait.head; st != nil; {
		next := st.next
		if st.sendAvail > 0 {
			c.streamWait.remove(st)
			c.connWait.push(st)
		}
		st = next
	}
	c.connRoomLocked()
}
