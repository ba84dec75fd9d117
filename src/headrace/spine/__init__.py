"""headrace.spine"""
