"""The kvsize web app's pages, one module each; app/streamlit_app.py draws the tabs and calls them.

Named views, not pages: Streamlit would turn every module of a pages/ folder beside the entry
script into a separate sidebar page."""
