"""headrace.reservoir"""
