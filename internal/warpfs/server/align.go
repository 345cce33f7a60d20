package server

import "unsafe"

// uintptrOf is the address of b's first byte (to align I/O buffers).
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
