"""Analysis of trained models: what the LSTM-RNN reads word by word (docs/analysis.md)."""
