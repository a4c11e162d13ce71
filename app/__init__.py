"""kvsize front ends: the `kvsize` CLI and the Streamlit web app."""
