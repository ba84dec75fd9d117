"""headrace.buffer"""
