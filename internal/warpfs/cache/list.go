package cache

// list is an intrusive doubly linked list of extents: the clean LRU (least recently used at
// the head) and the dirty queue (oldest dirtied at the head). An extent is in at most one.
type list struct {
	head, tail *extent
	n          int
}

func (l *list) pushBack(e *extent) {
	e.in, e.prev, e.next = l, l.tail, nil
	if l.tail != nil {
		l.tail.next = e
	} else {
		l.head = e
	}
	l.tail = e
	l.n++
}

func (l *list) remove(e *extent) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.in, e.prev, e.next = nil, nil, nil
	l.n--
}

// unlink takes e out of whatever list holds it.
func (e *extent) unlink() {
	if e.in != nil {
		e.in.remove(e)
	}
}
