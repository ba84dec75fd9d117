"""headrace.backup"""
