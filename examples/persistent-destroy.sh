#!/bin/bash
# Destroy the persistent instance "demo" and everything in it.
#BB destroy_persistent name=demo
echo "persistent instance demo destroyed"
